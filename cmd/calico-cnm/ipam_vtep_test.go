package main

import (
	"context"
	"net/netip"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// TestCLIIPAMCheckVTEP: a node's VTEP address has no endpoint record; it
// is live while the node's record exists and a leak once the node is gone.
func TestCLIIPAMCheckVTEP(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	eng := ipam.New(store, ipam.Options{Log: quietLog()})
	ctx := context.Background()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.70.0.0/16", VXLANMode: ipam.EncapAlways}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"h1", "h2"} {
		if _, err := eng.EnsureTunnelAddress(ctx, node, []netip.Prefix{netip.MustParsePrefix("10.70.0.0/16")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Txn(ctx, datastore.Create(datastore.NodeKey("h1"), datastore.MustJSON(datastore.Node{Name: "h1", IPv4: "172.20.0.1"}))); err != nil {
		t.Fatal(err)
	}
	// The VTEPs were assigned a moment ago: --min-age 0 judges them now.
	env := map[string]string{"NODENAME": "h1", "DOCKER_HOST": fakeDockerd(t)}
	runSteps(t, env, []step{
		{name: "only the VTEP of the node without a record leaks", args: withEtcd(ep, "ipam", "check", "--min-age", "0s"), code: exitProblem,
			stdout: "leaked addresses:     1\n  vxlan-tunnel-addr-h2\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\n"},
	})
}
