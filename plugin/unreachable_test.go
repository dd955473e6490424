package plugin_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestDatastoreFailureReachesDockerAsUnreachable: whatever shape a datastore
// failure has when it reaches a driver (the raw gRPC status a loaded etcd
// returns, a context deadline, a reset connection), both drivers' replies
// to Docker say "datastore unreachable".
func TestDatastoreFailureReachesDockerAsUnreachable(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	shapes := []struct {
		name string
		err  error
	}{
		{"grpc Unknown context deadline", status.Error(codes.Unknown, "context deadline exceeded")},
		{"etcd-wrapped grpc Unknown", fmt.Errorf("etcd: %w", status.Error(codes.Unknown, "context deadline exceeded"))},
		{"grpc DeadlineExceeded", status.Error(codes.DeadlineExceeded, "context deadline exceeded")},
		{"grpc Unavailable", status.Error(codes.Unavailable, "connection refused")},
		{"context deadline", fmt.Errorf("reading block: %w", context.DeadlineExceeded)},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}},
	}
	calls := []struct{ path, body string }{
		{"/IpamDriver.RequestPool", `{"AddressSpace":"CalicoLocalAddressSpace","Pool":"10.10.1.0/24"}`},
		{"/IpamDriver.RequestAddress", `{"PoolID":"10.10.1.0/24","Address":"","Options":{}}`},
		{"/IpamDriver.ReleaseAddress", `{"PoolID":"10.10.1.0/24","Address":"10.10.1.7"}`},
		{"/NetworkDriver.CreateNetwork", `{"NetworkID":"` + strings.Repeat("a", 64) + `","IPv4Data":[{"AddressSpace":"CalicoLocalAddressSpace","Pool":"10.10.1.0/24","Gateway":"10.10.1.1/24"}]}`},
	}
	for _, sh := range shapes {
		for _, c := range calls {
			t.Run(sh.name+c.path, func(t *testing.T) {
				e.ipam.Err = sh.err
				defer func() { e.ipam.Err = nil }()
				code, _, out := post(t, e.ts.URL, c.path, c.body)
				msg, _ := out["Err"].(string)
				if code != 500 || !strings.Contains(msg, "datastore unreachable") {
					t.Errorf("%s with %v: %d %q, want 500 saying \"datastore unreachable\"", c.path, sh.err, code, msg)
				}
			})
		}
	}
}
