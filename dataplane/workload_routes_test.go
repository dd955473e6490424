package dataplane

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

// TestMissingWorkloadRoutes: it reports exactly the deleted host routes,
// changes nothing, and a missing interface is ErrNoInterface.
func TestMissingWorkloadRoutes(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.8.1/32"), IPv6: mustCIDR(t, "fd00:65:8::1/128")}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatal(err)
	}
	name := HostIfName(w.EndpointID)
	ips := []net.IPNet{*w.IPv4, *w.IPv6}
	if missing, err := l.MissingWorkloadRoutes(ctx, name, ips); err != nil || len(missing) != 0 {
		t.Fatalf("fresh workload: missing %v, %v", missing, err)
	}
	run(t, "ip", "-n", tn.name, "route", "del", "10.65.8.1/32")
	before := tn.ourRoutes(t)
	missing, err := l.MissingWorkloadRoutes(ctx, name, ips)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0].String() != "10.65.8.1/32" {
		t.Errorf("missing = %v, want [10.65.8.1/32]", missing)
	}
	if after := tn.ourRoutes(t); !equalStrings(after, before) {
		t.Errorf("MissingWorkloadRoutes changed the routes: %v -> %v", before, after)
	}
	if _, err := l.MissingWorkloadRoutes(ctx, HostIfName(newEndpointID()), ips); !errors.Is(err, ErrNoInterface) {
		t.Errorf("missing interface: %v, want ErrNoInterface", err)
	}
}

// TestDetachedWorkloads: a pair with both ends here is detached until its
// tmp end moves into a container; only detached pairs are listed and
// removed; foreign cali* veths are not.
func TestDetachedWorkloads(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	a := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.9.1/32")}
	b := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.9.2/32")}
	for _, w := range []Workload{a, b} {
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	// A cali* veth that is not one of ours: its peer has another name.
	foreign := HostIfName(newEndpointID())
	run(t, "ip", "-n", tn.name, "link", "add", foreign, "type", "veth", "peer", "name", "other"+randHex(4))
	// b's container side goes into a "container", as Docker does.
	ctr := newTestNS(t)
	run(t, "ip", "-n", tn.name, "link", "set", TempIfName(b.EndpointID), "netns", ctr.name)

	got, err := l.ListDetachedWorkloads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{HostIfName(a.EndpointID)}; !equalStrings(got, want) {
		t.Fatalf("detached = %v, want %v", got, want)
	}
	// b is attached: removing it as detached is a no-op.
	if err := l.RemoveDetachedWorkload(ctx, HostIfName(b.EndpointID)); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveDetachedWorkload(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveDetachedWorkload(ctx, HostIfName(a.EndpointID)); err != nil {
		t.Fatal(err)
	}
	names := strings.Join(tn.linkNames(t), " ")
	for _, n := range []string{HostIfName(b.EndpointID), foreign} {
		if !strings.Contains(names, n) {
			t.Errorf("%s was removed: links %s", n, names)
		}
	}
	for _, n := range []string{HostIfName(a.EndpointID), TempIfName(a.EndpointID)} {
		if strings.Contains(names, n) {
			t.Errorf("%s still there: links %s", n, names)
		}
	}
	if r := tn.routesTo(t, a.IPv4.IP); len(r) != 0 {
		t.Errorf("route to a's address left: %v", r)
	}
	if err := l.RemoveDetachedWorkload(ctx, HostIfName(a.EndpointID)); err != nil {
		t.Errorf("removing it again: %v", err)
	}
}
