package routing

import (
	"net/netip"
	"testing"
)

type ownsSet map[netip.Prefix]bool

func (o ownsSet) Owns(dst netip.Prefix) bool { return o[dst] }
func (o ownsSet) Status() VXLANStatus        { return VXLANStatus{Passes: 7} }

// TestLeaveToVXLAN: the BGP agent drops learned routes VXLAN owns, keeps
// the others, and reports VXLAN's status.
func TestLeaveToVXLAN(t *testing.T) {
	p := netip.MustParsePrefix
	gw := []netip.Addr{netip.MustParseAddr("172.16.1.3")}
	routes := map[netip.Prefix][]netip.Addr{p("10.0.1.0/26"): gw, p("10.0.2.0/26"): gw, p("10.0.2.7/32"): gw}
	leaveToVXLAN(routes, ownsSet{p("10.0.2.0/26"): true})
	if len(routes) != 2 || routes[p("10.0.2.0/26")] != nil || routes[p("10.0.1.0/26")] == nil || routes[p("10.0.2.7/32")] == nil {
		t.Fatalf("routes after leaveToVXLAN: %v", routes)
	}
	leaveToVXLAN(routes, nil)
	if len(routes) != 2 {
		t.Fatalf("no VXLAN manager, yet routes changed: %v", routes)
	}
	if st := vxlanStatus(ownsSet{}); st == nil || st.Passes != 7 {
		t.Fatalf("status %+v", st)
	}
	if vxlanStatus(nil) != nil {
		t.Fatal("a VXLAN status without a manager")
	}
}
