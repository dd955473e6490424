// Package etcdtest gives tests a real etcd: an embedded member on free
// loopback ports with its data in the test's temp dir.
package etcdtest

import (
	"context"
	"fmt"
	"net"
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

// Member is a running embedded etcd plus the config to reach it.
type Member struct {
	Store  *datastore.Store
	Config datastore.Config
}

// Start runs an embedded member and returns a store on it; both stop when
// the test ends.
func Start(t testing.TB) *Member {
	t.Helper()
	cfg := datastore.Config{
		Embedded:          true,
		DataDir:           t.TempDir(),
		EmbeddedClientURL: fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)),
		EmbeddedPeerURL:   fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)),
		RequestTimeout:    10 * time.Second,
		// Shutdown races in etcd log at error level; tests need none of it.
		EmbeddedLogLevel: "fatal",
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := datastore.Open(ctx, cfg, log)
	if err != nil {
		t.Fatalf("starting embedded etcd: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &Member{Store: s, Config: cfg}
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
