package etcdtest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// TestPortInUseIsEADDRINUSE: an embedded member whose client port is
// taken fails with an error that says so through errors.Is, which is
// what Start retries on.
func TestPortInUseIsEADDRINUSE(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := memberConfig(t, "http://"+l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := datastore.Open(ctx, cfg, nil)
	if err == nil {
		s.Close()
		t.Fatal("a member started on a port in use")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("error %v (%T) is not EADDRINUSE", err, err)
	}
}

// TestDeadPortRefusesAndStaysTaken: connecting to a DeadPort is refused,
// and nobody can listen on it while the test runs (not even with
// SO_REUSEADDR, which Go's listeners set).
func TestDeadPortRefusesAndStaysTaken(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(DeadPort(t)))
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("a connection to the dead port %s was accepted", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connecting to the dead port %s: %v, want connection refused", addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err == nil {
		l.Close()
		t.Fatalf("listened on the dead port %s", addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listening on the dead port %s: %v, want address in use", addr, err)
	}
}
