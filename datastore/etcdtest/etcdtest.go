// Package etcdtest gives tests a real etcd: an embedded member on free
// loopback ports with its data in the test's temp dir.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// FreePort asks the kernel for an unused loopback TCP port.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// DeadPort is a loopback TCP port that refuses every connection until the
// test ends: the port is bound, so nobody else can listen on it, but never
// listened on. An endpoint meant to be unreachable needs it: a port
// FreePort picked can be taken meanwhile by a member of another test
// package, which then answers.
func DeadPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket for a dead port: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("binding a dead port: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("reading the dead port: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// Member is a running embedded etcd plus the config to reach it.
type Member struct {
	Store  *datastore.Store
	Config datastore.Config
}

// startAttempts bounds Start's tries with fresh ports.
const startAttempts = 5

// Start runs an embedded member and returns a store on it; both stop when
// the test ends. The ports FreePort picks are free when picked, not when
// the member binds them: with test packages running side by side another
// process may take one in between, so a bind refused as in use is tried
// again on new ports.
func Start(t testing.TB) *Member {
	t.Helper()
	var err error
	for range startAttempts {
		cfg := memberConfig(t, fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
		var s *datastore.Store
		if s, err = open(cfg); err == nil {
			t.Cleanup(func() { _ = s.Close() })
			return &Member{Store: s, Config: cfg}
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatalf("starting embedded etcd: %v", err)
	return nil
}

// memberConfig is the config of an embedded member serving clients at
// clientURL, with a fresh data directory and peer port.
func memberConfig(t testing.TB, clientURL string) datastore.Config {
	return datastore.Config{
		Embedded:          true,
		DataDir:           t.TempDir(),
		EmbeddedClientURL: clientURL,
		EmbeddedPeerURL:   fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)),
		RequestTimeout:    10 * time.Second,
		// Shutdown races in etcd log at error level; tests need none of it.
		EmbeddedLogLevel: "fatal",
	}
}

func open(cfg datastore.Config) (*datastore.Store, error) {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return datastore.Open(ctx, cfg, log)
}

// Client opens another client store on the same member, as a second host
// would: it shares the data but not the connection or the counters.
func (m *Member) Client(t testing.TB) *datastore.Store {
	t.Helper()
	cfg := m.Config
	cfg.Embedded = false
	cfg.Endpoints = []string{cfg.EmbeddedClientURL}
	s, err := datastore.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("connecting to embedded etcd: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Wipe stops the member and starts an empty one at the same URLs (its
// data lost, as an operator rebuilding etcd would). The new member's store
// replaces m.Store; the old member's clients reach it in a while (Reach).
func (m *Member) Wipe(t testing.TB) {
	t.Helper()
	_ = m.Store.Close()
	m.Config.DataDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := datastore.Open(ctx, m.Config, nil)
	if err != nil {
		t.Fatalf("replacement member: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	m.Store = s
}

// Reach waits until c, a client of a wiped member, is answered by the new
// one: that read meets the lower revision.
func Reach(t testing.TB, c *datastore.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if _, err := c.List(ctx, "no-such-prefix/"); err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the client never reached the new member")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
