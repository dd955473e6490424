package harness

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// Router joins several fabrics: a network namespace (a Host without
// dockerd) with a leg on each fabric's bridge and IPv4 forwarding on. It has
// routes to its fabrics' subnets only (no default route), so anything
// addressed outside them - a container address that was not encapsulated -
// dies there. Hosts use it after RouteHosts.
type Router struct {
	*Host
	fabrics []*Fabric
	// Legs is the router's address on each fabric, by bridge name.
	Legs map[string]net.IP
}

// NewRouter creates a router with a leg on each of fabrics (at least two).
// Its leg on fabrics[0] is its eth0; the others are eth1, eth2, ...
func NewRouter(t testing.TB, name string, fabrics ...*Fabric) *Router {
	t.Helper()
	if len(fabrics) < 2 {
		t.Fatal("harness: a router needs at least two fabrics")
	}
	h := fabrics[0].AddHost(t, name, HostOptions{NoDockerd: true})
	r := &Router{Host: h, fabrics: fabrics, Legs: map[string]net.IP{fabrics[0].Bridge: h.IP}}
	if _, err := runCmd(nil, nil, "ip", "-n", h.Netns, "route", "del", "default"); err != nil {
		t.Fatalf("harness: %v", err)
	}
	for i, f := range fabrics[1:] {
		ip, _ := f.nextAddr(t)
		dev := fmt.Sprintf("eth%d", i+1)
		root := NamePrefix + "r" + randHex(5)
		if _, err := runCmd(nil, nil, "ip", "link", "add", root, "type", "veth", "peer", "name", dev, "netns", h.Netns); err != nil {
			t.Fatalf("harness: %v", err)
		}
		untrack := track(resource{Kind: "link", Name: root})
		t.Cleanup(func() {
			// Usually gone with the namespace already.
			if _, err := net.InterfaceByName(root); err == nil {
				if _, err := runCmd(nil, nil, "ip", "link", "delete", root); err != nil {
					t.Errorf("harness: deleting %s: %v", root, err)
				}
			}
			untrack()
		})
		for _, argv := range [][]string{
			{"ip", "link", "set", root, "master", f.Bridge},
			{"ip", "link", "set", root, "up"},
			{"ip", "-n", h.Netns, "addr", "add", fmt.Sprintf("%s/%d", ip, prefixLen(f.Subnet)), "dev", dev},
			{"ip", "-n", h.Netns, "link", "set", dev, "up"},
		} {
			if _, err := runCmd(nil, nil, argv...); err != nil {
				t.Fatalf("harness: %v", err)
			}
		}
		r.Legs[f.Bridge] = ip
	}
	// /proc/sys/net is the writer's namespace's (nsenter --net).
	if _, err := h.Exec(t, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		t.Fatalf("harness: enabling forwarding on router %s: %v", name, err)
	}
	t.Logf("harness: router %s (netns %s) joins %s", name, h.Netns, r.describeLegs())
	return r
}

func (r *Router) describeLegs() string {
	var parts []string
	for _, f := range r.fabrics {
		parts = append(parts, fmt.Sprintf("%s at %s", f.Subnet, r.Legs[f.Bridge]))
	}
	return strings.Join(parts, ", ")
}

// RouteHosts gives each host (on one of the router's fabrics) a route to
// every other fabric's subnet via the router's leg on its own fabric. The
// other fabrics' gateways stay reached directly through the host's own
// gateway: they are root-namespace services (etcd), which answer directly
// and would otherwise see asymmetric paths.
func (r *Router) RouteHosts(t testing.TB, hosts ...*Host) {
	t.Helper()
	for _, h := range hosts {
		var own *Fabric
		for _, f := range r.fabrics {
			if h.Subnet != nil && f.Subnet.String() == h.Subnet.String() {
				own = f
			}
		}
		if own == nil {
			t.Fatalf("harness: host %s is on none of router %s's fabrics", h.Name, r.Name)
		}
		for _, f := range r.fabrics {
			if f == own {
				continue
			}
			for _, argv := range [][]string{
				{"ip", "-n", h.Netns, "route", "add", f.Subnet.String(), "via", r.Legs[own.Bridge].String()},
				{"ip", "-n", h.Netns, "route", "add", f.Gateway.String() + "/32", "via", own.Gateway.String()},
			} {
				if _, err := runCmd(nil, nil, argv...); err != nil {
					t.Fatalf("harness: %v", err)
				}
			}
		}
	}
}

// nextAddr reserves the fabric's next free address (and returns its
// offset in the subnet).
func (f *Fabric) nextAddr(t testing.TB) (net.IP, uint32) {
	t.Helper()
	f.mu.Lock()
	off := f.next
	f.next++
	f.mu.Unlock()
	ip := addrAt(f.Subnet, off)
	if !f.Subnet.Contains(ip) || ip.Equal(broadcast(f.Subnet)) {
		t.Fatalf("harness: fabric %s is full", f.Subnet)
	}
	return ip, off
}
