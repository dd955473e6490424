package main

import (
	"context"
	"testing"

	"github.com/calico-cnm/calico-cnm/ipam"
)

// TestCLIIPAMCheckSwarm: addresses the swarm manager assigned (service
// VIPs, tasks not started yet) have no endpoint record and are not leaks;
// `ipam check --release` must leave them to the manager.
func TestCLIIPAMCheckSwarm(t *testing.T) {
	m, ep := startEtcd(t)
	eng := ipam.New(m.Client(t), ipam.Options{Log: quietLog()})
	ctx := context.Background()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.50.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		handle string
		attrs  map[string]string
	}{
		{"cnm.vip", map[string]string{ipam.AttrNode: "mgr", ipam.AttrSwarm: "true"}},
		{"cnm.leaked", map[string]string{ipam.AttrNode: "mgr"}},
	} {
		if _, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "mgr", HandleID: a.handle, Attrs: a.attrs}); err != nil {
			t.Fatal(err)
		}
	}
	runSteps(t, nil, []step{
		{name: "only the non-swarm address is a leak", args: withEtcd(ep, "ipam", "check", "--release"),
			stdout: "leaked addresses:     1\n  cnm.leaked\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\nfixed 1 problem(s)\n"},
		{name: "the swarm address stays", args: withEtcd(ep, "ipam", "check"),
			stdout: "leaked addresses:     0\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\n"},
	})
	allocs, err := eng.Allocations(ctx)
	if err != nil || len(allocs) != 1 || allocs[0].HandleID != "cnm.vip" {
		t.Errorf("allocations after check --release = %+v, %v; want only cnm.vip", allocs, err)
	}
}
