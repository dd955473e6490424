package driver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ports"
)

// unprogrammablePorts is a ports manager whose tables cannot be written.
type unprogrammablePorts struct{}

func (unprogrammablePorts) Publish(context.Context, string, []ports.Request) ([]datastore.PortBinding, error) {
	return nil, nil
}
func (unprogrammablePorts) Unpublish(context.Context, string) error { return nil }
func (unprogrammablePorts) Sync(context.Context) error {
	return errors.New("nftables: operation not permitted")
}

// TestJoinInternalGuardFailureLeavesNothing: when the guard of an
// --internal network cannot be programmed, Join fails closed and leaves
// neither the veth nor a joined record (which policy and the guard would
// keep rules for, and a later Join into the same sandbox would count as a
// live interface).
func TestJoinInternalGuardFailureLeavesNothing(t *testing.T) {
	m := etcdtest.Start(t)
	e := newEnv(t, m.Store)
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{MTU: 1400, IPAM: e.ipam, Ports: unprogrammablePorts{}})
	nInt := e.createNetworkWith(t, "10.10.3.0/24", map[string]interface{}{ports.OptInternal: true})
	ep := e.createEndpoint(t, nInt, "10.10.3.10/32", "")
	_, err := e.nd.Join(context.Background(), &network.JoinRequest{NetworkID: nInt, EndpointID: ep, SandboxKey: "/var/run/docker/netns/guard1"})
	if err == nil || !strings.Contains(err.Error(), "--internal guard") {
		t.Fatalf("Join = %v, want the --internal guard's failure", err)
	}
	if w, ok := e.dp.Workload(ep); ok {
		t.Errorf("veth %s left behind", w.HostIfName)
	}
	rec, ok := e.endpoint(t, ep)
	if !ok {
		t.Fatal("endpoint record gone: CreateEndpoint's record must stay for DeleteEndpoint")
	}
	if rec.Joined || rec.Container != "" || rec.GatewayIndex != 0 || rec.Routes != nil || rec.Labels != nil {
		t.Errorf("record still joined after the failed Join: %+v", rec)
	}
}

// unpublishRecorder records which endpoints' ports were withdrawn.
type unpublishRecorder struct {
	unprogrammablePorts
	withdrawn []string
}

func (u *unpublishRecorder) Unpublish(_ context.Context, endpointID string) error {
	u.withdrawn = append(u.withdrawn, endpointID)
	return nil
}

// TestDeleteEndpointWithdrawsPorts: an endpoint deleted with published
// ports still recorded (Docker never sent RevokeExternalConnectivity, as
// after a crash between the calls) has them withdrawn, so no DNAT rule
// outlives it.
func TestDeleteEndpointWithdrawsPorts(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	rec := &unpublishRecorder{}
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{MTU: 1400, IPAM: e.ipam, Ports: rec})
	n := e.createNetworkWith(t, "10.10.4.0/24", nil)
	withPorts, plain := e.createEndpoint(t, n, "10.10.4.10/32", ""), e.createEndpoint(t, n, "10.10.4.11/32", "")
	key := datastore.EndpointKey(testHost, withPorts)
	var ep datastore.Endpoint
	rev, err := m.Store.GetJSON(ctx, key, &ep)
	if err != nil {
		t.Fatal(err)
	}
	ep.Ports = []datastore.PortBinding{{Proto: "tcp", HostPort: 18080, Port: 8080}}
	if err := m.Store.Txn(ctx, datastore.Update(key, datastore.MustJSON(ep), rev)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{withPorts, plain} {
		if err := e.nd.DeleteEndpoint(ctx, &network.DeleteEndpointRequest{NetworkID: n, EndpointID: id}); err != nil {
			t.Fatalf("DeleteEndpoint %s: %v", id, err)
		}
	}
	if len(rec.withdrawn) != 1 || rec.withdrawn[0] != withPorts {
		t.Errorf("ports withdrawn for %q, want only %s", rec.withdrawn, withPorts)
	}
}
