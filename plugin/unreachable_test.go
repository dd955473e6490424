package plugin_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

// TestDatastoreFailureReachesDockerAsUnreachable: whatever shape a datastore
// failure has when it reaches a driver (the raw gRPC status a loaded etcd
// returns, a context deadline, a reset connection), both drivers' replies
// to Docker say "datastore unreachable".
func TestDatastoreFailureReachesDockerAsUnreachable(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	shapes := unreachableShapes()
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

// unreachableShapes are the shapes in which the etcd client hands a
// datastore failure to its caller: gRPC statuses (a loaded member's own
// deadline comes back as Unknown), the client's context deadline, a reset
// or refused connection, and the member's own errors as the client turns
// them into rpctypes errors (no leader, a request timed out in an
// election).
func unreachableShapes() []struct {
	name string
	err  error
} {
	return []struct {
		name string
		err  error
	}{
		{"grpc Unknown context deadline", status.Error(codes.Unknown, "context deadline exceeded")},
		{"etcd-wrapped grpc Unknown", fmt.Errorf("etcd: %w", status.Error(codes.Unknown, "context deadline exceeded"))},
		{"grpc DeadlineExceeded", status.Error(codes.DeadlineExceeded, "context deadline exceeded")},
		{"grpc Unavailable", status.Error(codes.Unavailable, "connection refused")},
		{"context deadline", fmt.Errorf("reading block: %w", context.DeadlineExceeded)},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}},
		{"connection reset in a syscall error", fmt.Errorf("reading reply: %w", os.NewSyscallError("read", syscall.ECONNRESET))},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}},
		{"unexpected EOF", fmt.Errorf("reading reply: %w", io.ErrUnexpectedEOF)},
		{"etcd no leader", rpctypes.ErrNoLeader},
		{"etcd request timed out", rpctypes.ErrTimeout},
		{"etcd timed out, leader failed", rpctypes.ErrTimeoutDueToLeaderFail},
		{"etcd timed out, connection lost", rpctypes.ErrTimeoutDueToConnectionLost},
		{"etcd leader changed", rpctypes.ErrLeaderChanged},
		{"etcd server stopped", rpctypes.ErrStopped},
		{"etcd grpc no leader status", rpctypes.ErrGRPCNoLeader},
	}
}

// TestStoreFailureReachesDockerAsUnreachable: the same shapes met by the
// network driver's own reads of the real store (its client's KV failing
// as etcd's would) reach Docker as "datastore unreachable" too.
func TestStoreFailureReachesDockerAsUnreachable(t *testing.T) {
	m := etcdtest.Start(t)
	store, faults := m.FaultyClient(t)
	nd := driver.NewNetworkDriver(store, drivertest.NewDataplane(), host, quietLog(), driver.Options{IPAM: drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"})})
	srv := plugin.NewServer(nd, nil, quietLog())
	ts := httptest.NewServer(srv.Handler("NetworkDriver"))
	t.Cleanup(ts.Close)
	ep := strings.Repeat("e", 64)
	calls := []struct{ path, body string }{
		{"/NetworkDriver.EndpointOperInfo", `{"NetworkID":"` + strings.Repeat("a", 64) + `","EndpointID":"` + ep + `"}`},
		{"/NetworkDriver.Join", `{"NetworkID":"` + strings.Repeat("a", 64) + `","EndpointID":"` + ep + `","SandboxKey":"/var/run/docker/netns/x"}`},
	}
	for _, sh := range unreachableShapes() {
		for _, c := range calls {
			t.Run(sh.name+c.path, func(t *testing.T) {
				faults.FailReads(sh.err)
				defer faults.FailReads(nil)
				code, _, out := post(t, ts.URL, c.path, c.body)
				msg, _ := out["Err"].(string)
				if code != 500 || !strings.Contains(msg, "datastore unreachable") {
					t.Errorf("%s with %v: %d %q, want 500 saying \"datastore unreachable\"", c.path, sh.err, code, msg)
				}
			})
		}
	}
}
