package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
)

// The plugin APIs a handler can serve (Plugin.Activate's "Implements").
const (
	ImplementsNetworkDriver = "NetworkDriver"
	ImplementsIpamDriver    = "IpamDriver"
)

// ContentType is what Docker's plugin protocol (v1.1) speaks.
const ContentType = "application/vnd.docker.plugins.v1.1+json"

// MaxBodyBytes bounds a request body; Docker's are a few hundred bytes.
const MaxBodyBytes = 1 << 20

// Socket serving parameters.
const (
	socketMode      = 0o660
	shutdownTimeout = 5 * time.Second
	staleDialWait   = time.Second
)

// Server is the HTTP face of the two drivers: Docker's plugin protocol (JSON
// over HTTP POST on a unix socket) with uniform errors, body limits and panic
// recovery.
type Server struct {
	nd  *driver.NetworkDriver
	id  *driver.IPAMDriver
	log logrus.FieldLogger

	// Observer, when set (before serving), is called after every request
	// with the route ("/NetworkDriver.Join"; "/" for unknown paths), the
	// status code and the time taken: the hook for request metrics.
	Observer func(path string, code int, d time.Duration)
}

// NewServer serves nd (the "NetworkDriver" API) and id (the "IpamDriver" API).
func NewServer(nd *driver.NetworkDriver, id *driver.IPAMDriver, log logrus.FieldLogger) *Server {
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Server{nd: nd, id: id, log: log}
}

// errorBody is what Docker reads from a non-2xx reply (network and IPAM alike).
type errorBody struct {
	Err string
}

// statusWriter remembers the status for logging and the observer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Err: "calico-cnm could not encode its reply: " + err.Error()})
	}
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Err: msg})
}

// Handler serves Plugin.Activate plus the APIs in implements
// (ImplementsNetworkDriver, ImplementsIpamDriver): one handler for both on
// the managed plugin's single socket, or one per socket.
func (s *Server) Handler(implements ...string) http.Handler {
	mux := http.NewServeMux()
	impl := append([]string{}, implements...)
	sort.Strings(impl)
	s.route(mux, "/Plugin.Activate", func(r *http.Request) (int, any) {
		return http.StatusOK, struct{ Implements []string }{impl}
	})
	for _, api := range impl {
		switch api {
		case ImplementsNetworkDriver:
			if s.nd == nil {
				panic("plugin: Handler(NetworkDriver) without a network driver")
			}
		case ImplementsIpamDriver:
			if s.id == nil {
				panic("plugin: Handler(IpamDriver) without an IPAM driver")
			}
		default:
			panic(fmt.Sprintf("plugin: unknown plugin API %q", api))
		}
	}
	for _, m := range s.pluginMethods() {
		if slices.Contains(impl, m.api) {
			s.route(mux, "/"+m.api+"."+m.name, m.handler)
		}
	}
	s.route(mux, "/", func(r *http.Request) (int, any) {
		return http.StatusNotFound, errorBody{Err: fmt.Sprintf("calico-cnm does not implement %s on this socket", printablePath(r.URL.Path))}
	})
	return mux
}

// printablePath keeps the 404 message on one line: a path with a line break
// or another unprintable rune is quoted, Go style, rather than echoed.
func printablePath(path string) string {
	if strings.ContainsFunc(path, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(path)
	}
	return path
}

// route registers path with the uniform wrapping: POST only, body limit,
// panic recovery, logging, observer.
func (s *Server) route(mux *http.ServeMux, path string, fn func(r *http.Request) (int, any)) {
	mux.HandleFunc(path, func(rw http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w := &statusWriter{ResponseWriter: rw}
		log := s.log.WithFields(logrus.Fields{"method": r.URL.Path})
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.WithField("panic", fmt.Sprint(p)).Errorf("handler panicked:\n%s", debug.Stack())
				if w.code == 0 {
					writeErr(w, http.StatusInternalServerError, fmt.Sprintf("internal error in calico-cnm while handling %s: %v (see the calico-cnm log)", r.URL.Path, p))
				}
			}
			d := time.Since(start)
			code := w.code
			if code == 0 {
				code = http.StatusOK
			}
			log.WithFields(logrus.Fields{"code": code, "duration": d}).Debug("plugin request")
			if s.Observer != nil {
				// The route, not the raw path: unknown paths all count as
				// "/", which keeps metric labels bounded.
				s.Observer(path, code, d)
			}
		}()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeErr(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s needs POST, not %s", r.URL.Path, r.Method))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		code, v := fn(r)
		writeJSON(w, code, v)
	})
}

// readBody reads a request body within MaxBodyBytes.
func readBody(r *http.Request) ([]byte, int, error) {
	b, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request to %s is larger than %d bytes", r.URL.Path, tooBig.Limit)
	}
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("reading request to %s: %w", r.URL.Path, err)
	}
	return b, 0, nil
}

// call decodes Req, calls fn and encodes its answer or error. Both
// drivers' errors pass datastore.Unreachable on the way out, so whatever
// layer met a datastore failure, Docker reads "datastore unreachable".
func call[Req any, Resp any](fn func(context.Context, *Req) (Resp, error)) func(r *http.Request) (int, any) {
	return func(r *http.Request) (int, any) {
		b, code, err := readBody(r)
		if err != nil {
			return code, errorBody{Err: err.Error()}
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return http.StatusBadRequest, errorBody{Err: fmt.Sprintf("malformed request to %s: empty body", r.URL.Path)}
		}
		req := new(Req)
		if err := json.Unmarshal(b, req); err != nil {
			return http.StatusBadRequest, errorBody{Err: fmt.Sprintf("malformed request to %s: %v", r.URL.Path, err)}
		}
		resp, err := fn(r.Context(), req)
		if err != nil {
			return http.StatusInternalServerError, errorBody{Err: datastore.Unreachable(err).Error()}
		}
		return http.StatusOK, resp
	}
}

// callNoResp is call for methods that only succeed or fail: success is {}.
func callNoResp[Req any](fn func(context.Context, *Req) error) func(r *http.Request) (int, any) {
	return call(func(ctx context.Context, req *Req) (struct{}, error) {
		return struct{}{}, fn(ctx, req)
	})
}

// callNoReq is call for methods Docker sends without a body.
func callNoReq[Resp any](fn func(context.Context) (Resp, error)) func(r *http.Request) (int, any) {
	return func(r *http.Request) (int, any) {
		if _, code, err := readBody(r); err != nil {
			return code, errorBody{Err: err.Error()}
		}
		resp, err := fn(r.Context())
		if err != nil {
			return http.StatusInternalServerError, errorBody{Err: datastore.Unreachable(err).Error()}
		}
		return http.StatusOK, resp
	}
}

// pluginMethod is one method of a plugin API and the handler that serves it
// (at "/<api>.<name>").
type pluginMethod struct {
	api, name string
	handler   func(r *http.Request) (int, any)
}

// pluginMethods are the methods of both plugin APIs. The driver of an API
// that is not served may be nil: Handler routes only the served APIs, so its
// methods are never called.
func (s *Server) pluginMethods() []pluginMethod {
	nd, id := s.nd, s.id
	const network, ipam = ImplementsNetworkDriver, ImplementsIpamDriver
	return []pluginMethod{
		{network, "GetCapabilities", callNoReq(nd.GetCapabilities)},
		{network, "CreateNetwork", callNoResp(nd.CreateNetwork)},
		{network, "AllocateNetwork", call(nd.AllocateNetwork)},
		{network, "DeleteNetwork", callNoResp(nd.DeleteNetwork)},
		{network, "FreeNetwork", callNoResp(nd.FreeNetwork)},
		{network, "CreateEndpoint", call(nd.CreateEndpoint)},
		{network, "EndpointOperInfo", call(nd.EndpointInfo)},
		{network, "DeleteEndpoint", callNoResp(nd.DeleteEndpoint)},
		{network, "Join", call(nd.Join)},
		{network, "Leave", callNoResp(nd.Leave)},
		{network, "DiscoverNew", callNoResp(nd.DiscoverNew)},
		{network, "DiscoverDelete", callNoResp(nd.DiscoverDelete)},
		{network, "ProgramExternalConnectivity", callNoResp(nd.ProgramExternalConnectivity)},
		{network, "RevokeExternalConnectivity", callNoResp(nd.RevokeExternalConnectivity)},
		{ipam, "GetCapabilities", callNoReq(id.GetCapabilities)},
		{ipam, "GetDefaultAddressSpaces", callNoReq(id.GetDefaultAddressSpaces)},
		{ipam, "RequestPool", call(id.RequestPool)},
		{ipam, "ReleasePool", callNoResp(id.ReleasePool)},
		{ipam, "RequestAddress", call(id.RequestAddress)},
		{ipam, "ReleaseAddress", callNoResp(id.ReleaseAddress)},
	}
}

// ServeUnix serves h on a unix socket at path until ctx is done, then shuts
// down gracefully (in-flight requests get a few seconds) and removes the
// socket. A socket file left by a dead server is replaced; one a live server
// answers on is not.
func (s *Server) ServeUnix(ctx context.Context, path string, h http.Handler) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the directory of socket %s: %w", path, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	ours, statErr := os.Stat(path)
	defer func() {
		// Remove the socket only if it is still ours (not a successor's).
		if cur, err := os.Stat(path); err == nil && statErr == nil && os.SameFile(cur, ours) {
			_ = os.Remove(path)
		}
	}()
	if err := os.Chmod(path, socketMode); err != nil {
		l.Close()
		return fmt.Errorf("setting the mode of socket %s: %w", path, err)
	}

	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()

	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serving %s: %w", path, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.log.WithError(err).WithField("socket", path).Warn("requests still running at shutdown: closing them")
		_ = srv.Close()
	}
	<-errc
	return nil
}

// removeStaleSocket removes a socket file nobody answers on. It refuses to
// touch anything else at path: a live server's socket or a non-socket file.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking socket path %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: remove it or choose another socket path", path)
	}
	conn, err := net.DialTimeout("unix", path, staleDialWait)
	if err == nil {
		conn.Close()
		return fmt.Errorf("another server is already listening on %s: is calico-cnm running twice?", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}
