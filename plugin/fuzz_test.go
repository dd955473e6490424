package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

// fuzzRoutes are every path the server answers, plus one it does not.
var fuzzRoutes = []string{
	"/Plugin.Activate",
	"/NetworkDriver.GetCapabilities",
	"/NetworkDriver.CreateNetwork",
	"/NetworkDriver.AllocateNetwork",
	"/NetworkDriver.DeleteNetwork",
	"/NetworkDriver.FreeNetwork",
	"/NetworkDriver.CreateEndpoint",
	"/NetworkDriver.EndpointOperInfo",
	"/NetworkDriver.DeleteEndpoint",
	"/NetworkDriver.Join",
	"/NetworkDriver.Leave",
	"/NetworkDriver.DiscoverNew",
	"/NetworkDriver.DiscoverDelete",
	"/NetworkDriver.ProgramExternalConnectivity",
	"/NetworkDriver.RevokeExternalConnectivity",
	"/IpamDriver.GetCapabilities",
	"/IpamDriver.GetDefaultAddressSpaces",
	"/IpamDriver.RequestPool",
	"/IpamDriver.ReleasePool",
	"/IpamDriver.RequestAddress",
	"/IpamDriver.ReleaseAddress",
	"/NoSuch.Method",
}

// trackingDataplane wraps the fake dataplane to expose the set of plumbed
// workloads, the dataplane's state for the no-change-on-rejection check.
type trackingDataplane struct {
	*drivertest.Dataplane
	mu  sync.Mutex
	set map[string]bool
}

func (d *trackingDataplane) AddWorkload(ctx context.Context, w dataplane.Workload) error {
	err := d.Dataplane.AddWorkload(ctx, w)
	if err == nil {
		d.mu.Lock()
		d.set[w.EndpointID] = true
		d.mu.Unlock()
	}
	return err
}

func (d *trackingDataplane) RemoveWorkload(ctx context.Context, id string, ips []net.IPNet) error {
	err := d.Dataplane.RemoveWorkload(ctx, id, ips)
	if err == nil {
		d.mu.Lock()
		delete(d.set, id)
		d.mu.Unlock()
	}
	return err
}

func (d *trackingDataplane) workloads() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(maps.Keys(d.set))
}

// fuzzEnv is the real server and drivers over the fakes and a real etcd.
type fuzzEnv struct {
	store *datastore.Store
	ipam  *drivertest.IPAM
	dp    *trackingDataplane
	h     http.Handler
}

// fuzzState is everything a request could change.
type fuzzState struct {
	Records   map[string]string
	Pools     []ipam.Pool
	Assigned  []string
	Workloads []string
}

func (e *fuzzEnv) state(t *testing.T) fuzzState {
	t.Helper()
	kvs, err := e.store.List(context.Background(), "")
	if err != nil {
		t.Fatalf("listing the datastore: %v", err)
	}
	recs := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		recs[kv.Key] = string(kv.Value)
	}
	return fuzzState{Records: recs, Pools: e.ipam.Pools(), Assigned: e.ipam.AssignedIPs(), Workloads: e.dp.workloads()}
}

// oversized is a syntactically valid request one byte over the limit, so
// only the size can be the reason for rejecting it.
func oversized() []byte {
	pad := plugin.MaxBodyBytes - len(`{"NetworkID":""}`) + 1
	return []byte(`{"NetworkID":"` + strings.Repeat("a", pad) + `"}`)
}

// FuzzPluginHandler drives the plugin's HTTP handler (both APIs on one
// handler, as on the managed plugin's socket) with arbitrary bodies on every
// path. The real drivers run over an in-memory IPAM and dataplane and a real
// etcd. Whatever the body: no panic (the server would turn one into a 500
// "internal error"), a JSON reply with Docker's content type, a one-line
// error on rejection, 413 for oversized bodies, and a rejected request leaves
// the datastore, the IPAM and the dataplane exactly as they were.
func FuzzPluginHandler(f *testing.F) {
	m := etcdtest.Start(f)
	env := &fuzzEnv{
		store: m.Store,
		ipam:  drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}, ipam.Pool{CIDR: "fd00:10::/48"}),
		dp:    &trackingDataplane{Dataplane: drivertest.NewDataplane(), set: map[string]bool{}},
	}
	nd := driver.NewNetworkDriver(m.Store, env.dp, host, quietLog(), driver.Options{IPAM: env.ipam})
	id := driver.NewIPAMDriver(env.ipam, host, quietLog())
	env.h = plugin.NewServer(nd, id, quietLog()).Handler(plugin.ImplementsNetworkDriver, plugin.ImplementsIpamDriver)

	// Oversized bodies on every route that reads one (the committed corpus
	// in testdata/fuzz holds the small seeds; a >1 MiB file does not belong
	// in the repository).
	for _, p := range fuzzRoutes {
		f.Add(p, oversized())
	}

	f.Fuzz(func(t *testing.T, path string, body []byte) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		before := env.state(t)
		req := &http.Request{
			Method:     http.MethodPost,
			URL:        &url.URL{Path: path},
			Proto:      "HTTP/1.1",
			ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {plugin.ContentType}},
			Body:          httpBody(body),
			ContentLength: int64(len(body)),
			Host:          "plugin",
			RequestURI:    path,
		}
		req = req.WithContext(context.Background())
		rec := httptest.NewRecorder()
		env.h.ServeHTTP(rec, req)
		res := rec.Result()
		raw := rec.Body.Bytes()

		// ServeMux answers unclean paths ("/a/../b") with a redirect of its
		// own, before any of our code runs: nothing else to check then.
		if res.StatusCode >= 300 && res.StatusCode < 400 {
			if after := env.state(t); !reflect.DeepEqual(before, after) {
				t.Fatalf("redirected request changed state")
			}
			return
		}
		if ct := res.Header.Get("Content-Type"); ct != plugin.ContentType {
			t.Fatalf("%s: Content-Type %q, want %q (code %d, body %q)", path, ct, plugin.ContentType, res.StatusCode, trunc(raw))
		}
		var reply map[string]any
		if err := json.Unmarshal(raw, &reply); err != nil {
			t.Fatalf("%s: reply is not a JSON object: %v: %q", path, err, trunc(raw))
		}
		if bytes.Contains(raw, []byte("internal error in calico-cnm")) || res.StatusCode == http.StatusInternalServerError && strings.Contains(fmt.Sprint(reply["Err"]), "panic") {
			t.Fatalf("%s: handler panicked on body %q: %s", path, trunc(body), trunc(raw))
		}
		readsBody := path != "/Plugin.Activate" && isRoute(path)
		if readsBody && len(body) > plugin.MaxBodyBytes && res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: %d-byte body answered %d, want 413", path, len(body), res.StatusCode)
		}
		if res.StatusCode == http.StatusOK {
			return
		}
		msg, _ := reply["Err"].(string)
		// Messages quote the request's values: a line break is only a
		// defect when the body carried none.
		if msg == "" || strings.Contains(msg, "\n") && !bodyHasLineBreak(body) {
			t.Fatalf("%s: rejection %d without a one-line Err: %q", path, res.StatusCode, trunc(raw))
		}
		if after := env.state(t); !reflect.DeepEqual(before, after) {
			t.Fatalf("%s: rejected request (%d %q) changed state:\nbefore %+v\nafter  %+v", path, res.StatusCode, msg, before, after)
		}
	})
}

func bodyHasLineBreak(b []byte) bool {
	l := bytes.ToLower(b)
	for _, s := range []string{"\n", "\r", `\n`, `\r`, `\u000a`, `\u000d`, `\u2028`, `\u2029`} {
		if bytes.Contains(l, []byte(s)) {
			return true
		}
	}
	return false
}

func isRoute(path string) bool {
	for _, r := range fuzzRoutes[:len(fuzzRoutes)-1] {
		if r == path {
			return true
		}
	}
	return false
}

type bodyReader struct{ *bytes.Reader }

func (bodyReader) Close() error { return nil }

func httpBody(b []byte) bodyReader { return bodyReader{bytes.NewReader(b)} }

func trunc(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}
