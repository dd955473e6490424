package datastore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
)

// EmbeddedClientSocket is the embedded member's client socket in the state
// dir: the daemon's and the CLI's default endpoint. A unix socket of mode
// 0600 lets root in and nobody else; the member has no TLS or auth of its
// own, so a TCP port would let every local user rewrite pools and network
// options or read BGP passwords.
const EmbeddedClientSocket = "etcd.sock"

// EmbeddedPeerSocket is the embedded member's peer (raft) socket in the
// state dir. A lone member talks to no peer, but etcd must listen for
// them: a unix socket of mode 0600 keeps local users from speaking raft to
// it, where a loopback TCP port would not.
const EmbeddedPeerSocket = "etcd-peer.sock"

// EmbeddedPeerURL is the default peer URL of the member whose state dir is
// stateDir.
func EmbeddedPeerURL(stateDir string) string {
	return "unix://" + filepath.Join(stateDir, EmbeddedPeerSocket)
}

// LoopbackClientURL is where daemons before the socket served the embedded
// member (and where `--etcd-listen-client http://127.0.0.1:2379` still
// does): the CLI's fallback.
const LoopbackClientURL = "http://127.0.0.1:2379"

// EmbeddedClientURL is the default client URL of the member whose state dir
// is stateDir.
func EmbeddedClientURL(stateDir string) string {
	return "unix://" + filepath.Join(stateDir, EmbeddedClientSocket)
}

// LocalEndpoint is the endpoint of this host's embedded member: its socket
// in stateDir when that exists, else the loopback port older daemons used.
func LocalEndpoint(stateDir string) string {
	if st, err := os.Stat(filepath.Join(stateDir, EmbeddedClientSocket)); err == nil && st.Mode()&os.ModeSocket != 0 {
		return EmbeddedClientURL(stateDir)
	}
	return LoopbackClientURL
}

// ErrExposedListener: an embedded member's listener other hosts could reach.
var ErrExposedListener = errors.New("the embedded etcd member has no TLS or authentication, so it listens only on a unix socket or a loopback address; several hosts need an etcd cluster with TLS (ETCD_ENDPOINTS)")

// checkLocalListen refuses an embedded member URL that is neither a unix
// socket nor plain loopback.
func checkLocalListen(flag string, u *url.URL) error {
	switch u.Scheme {
	case "unix":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
	}
	return fmt.Errorf("%s %s: %w", flag, u, ErrExposedListener)
}

// embeddedListenURLs parses the member's client and peer URLs and refuses
// any that other hosts could reach.
func embeddedListenURLs(cfg Config) (client, peer *url.URL, err error) {
	client, err = url.Parse(cfg.EmbeddedClientURL)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd client URL %q: %w", cfg.EmbeddedClientURL, err)
	}
	peer, err = url.Parse(cfg.EmbeddedPeerURL)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd peer URL %q: %w", cfg.EmbeddedPeerURL, err)
	}
	if err := checkLocalListen("--etcd-listen-client", client); err != nil {
		return nil, nil, err
	}
	if err := checkLocalListen("--etcd-listen-peer", peer); err != nil {
		return nil, nil, err
	}
	if peer.Scheme == "unix" && peer.Host == "" {
		// etcd opens its peer listener at the URL's host alone (the client
		// listener takes host and path): put the socket's path there.
		peer.Host, peer.Path = peer.Path, ""
	}
	return client, peer, nil
}

// embeddedMember is a single-member etcd cluster running inside the daemon:
// one host needs no external datastore, yet everything above uses the same
// client code as with a real cluster.
type embeddedMember struct {
	etcd     *embed.Etcd
	stopping *atomic.Bool
	// done ends the history compaction; compacting is its goroutine.
	done       chan struct{}
	compacting sync.WaitGroup
}

// embeddedHistory is how many revisions of history the member keeps: a
// watch that falls further behind is told its start was compacted, and
// the syncer lists again. Without compaction etcd keeps every revision of
// every key in its bolt file, which it maps with MAP_POPULATE: the whole
// file is resident, and a thousand Joins (each rewriting the IPAM block
// and the endpoint) grew it past 30 MB.
const embeddedHistory = 200

// defaultEmbeddedCompactEvery is how often the member's history is
// compacted when the revision moved. etcd's own revision auto-compaction
// looks only every five minutes, while a host starting its containers
// writes thousands of revisions in that time.
const defaultEmbeddedCompactEvery = 5 * time.Second

// embeddedCatchUpEntries is the raft log a lone member keeps in memory
// after compacting it (see startEmbedded).
const embeddedCatchUpEntries = 100

func startEmbedded(ctx context.Context, cfg Config, log logrus.FieldLogger) (*embeddedMember, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("embedded etcd needs a data directory (state dir)")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating embedded etcd data dir: %w", err)
	}
	clientURL, peerURL, err := embeddedListenURLs(cfg)
	if err != nil {
		return nil, err
	}
	ec := embed.NewConfig()
	ec.Name = cfg.EmbeddedName
	ec.Dir = filepath.Clean(cfg.DataDir)
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	if clientURL.Scheme == "unix" {
		// etcd wants host:port in advertised URLs, and nobody reads a lone
		// member's: its clients are configured with the socket's path.
		ec.AdvertiseClientUrls = []url.URL{{Scheme: "unix", Host: "localhost:0"}}
	}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	if peerURL.Scheme == "unix" {
		// As for the client URL: a lone member never dials its own peer
		// URL, but etcd wants host:port in it.
		ec.AdvertisePeerUrls = []url.URL{{Scheme: "unix", Host: "localhost:0"}}
	}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// After each in-memory snapshot (every 100 applied entries) etcd
	// keeps this many raft entries for slow followers; a lone member has
	// none. etcd's 5000 held the last 5000 writes in the daemon's heap
	// (some 7 MiB after a thousand Joins).
	ec.SnapshotCatchUpEntries = embeddedCatchUpEntries
	// embed.NewConfig leaves the slow-request threshold at zero, which makes
	// the member log every request as a "request stats" warning. A request
	// (or its apply) is worth a warning once it has used a tenth of the
	// time the daemon gives it: the lone member shares its host's disk with
	// the containers, and etcd's 100 ms apply threshold fires on a busy
	// host at every lease revoke of a clean stop.
	ec.WarningUnaryRequestDuration = cfg.RequestTimeout / 10
	ec.WarningApplyDuration = cfg.RequestTimeout / 10
	// The member has no authentication (it listens on a root-only socket),
	// so it needs no token provider: "" is etcd's none, where the default
	// "simple" provider warns at start that its tokens are unsigned.
	ec.AuthToken = ""
	stopping := &atomic.Bool{}
	zl, err := newEtcdLogger(log, cfg.EmbeddedLogLevel, stopping)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd log level %q: %w", cfg.EmbeddedLogLevel, err)
	}
	ec.Logger = "zap"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zl)
	// Restarting on an existing data dir must rejoin, not bootstrap anew.
	if _, err := os.Stat(filepath.Join(ec.Dir, "member")); err == nil {
		ec.ClusterState = embed.ClusterStateFlagExisting
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("starting embedded etcd in %s (client %s): %w", ec.Dir, clientURL, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		stopping.Store(true)
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s did not become ready within 60s", ec.Dir)
	case <-ctx.Done():
		stopping.Store(true)
		e.Close()
		return nil, ctx.Err()
	}
	// etcd creates its sockets under the umask; only root may connect.
	for _, u := range []*url.URL{clientURL, peerURL} {
		if u.Scheme != "unix" {
			continue
		}
		if err := os.Chmod(u.Host+u.Path, 0o600); err != nil {
			stopping.Store(true)
			e.Close()
			return nil, fmt.Errorf("restricting the embedded etcd socket %s to root: %w", u.Host+u.Path, err)
		}
	}
	log.WithFields(logrus.Fields{"dir": ec.Dir, "client": clientURL.String(), "peer": peerURL.String()}).Info("embedded etcd member ready")
	m := &embeddedMember{etcd: e, stopping: stopping, done: make(chan struct{})}
	every := cfg.embeddedCompactEvery
	if every <= 0 {
		every = defaultEmbeddedCompactEvery
	}
	m.compacting.Add(1)
	go func() {
		defer m.compacting.Done()
		m.compactHistory(every, cfg.RequestTimeout, log)
	}()
	return m, nil
}

// compactHistory compacts the member's history to its last
// embeddedHistory revisions every period in which the revision moved,
// until the member closes.
func (m *embeddedMember) compactHistory(every, timeout time.Duration, log logrus.FieldLogger) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.done:
		case <-m.etcd.Server.StoppingNotify():
		}
		cancel()
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var compacted int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		target := m.etcd.Server.KV().Rev() - embeddedHistory
		if target <= compacted {
			continue
		}
		cctx, ccancel := context.WithTimeout(ctx, timeout)
		_, err := m.etcd.Server.Compact(cctx, &pb.CompactionRequest{Revision: target})
		ccancel()
		switch {
		case err == nil, errors.Is(err, mvcc.ErrCompacted):
			// ErrCompacted: a client compacted further already.
			compacted = target
		case ctx.Err() != nil || m.stopping.Load():
			return
		default:
			// Tried again next period; the history only grows meanwhile.
			log.WithError(err).WithField("revision", target).Warn("compacting the embedded etcd history failed")
		}
	}
}

func (m *embeddedMember) close() {
	m.stopping.Store(true)
	close(m.done)
	m.compacting.Wait()
	m.etcd.Close()
}
