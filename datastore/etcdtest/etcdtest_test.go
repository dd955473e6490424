package etcdtest

import (
	"context"
	"errors"
	"net"
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
