package ipam

import (
	"net/netip"
	"testing"
)

func TestTunnelAddress(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.1.0.0/16", 26)
	v.pool("10.2.0.0/16", 26)
	pools := []netip.Prefix{pfx("10.1.0.0/16")}

	a, err := v.e.EnsureTunnelAddress(v.ctx, "h1", pools)
	if err != nil {
		t.Fatalf("EnsureTunnelAddress: %v", err)
	}
	blocks := hostBlocks(t, v.e, "h1")
	if len(blocks) != 1 || !blocks[0].Contains(a) || !pools[0].Contains(a) {
		t.Fatalf("tunnel address %s is not in a block of h1's own in the VXLAN pool (blocks %v)", a, blocks)
	}
	again, err := v.e.EnsureTunnelAddress(v.ctx, "h1", pools)
	if err != nil || again != a {
		t.Fatalf("second EnsureTunnelAddress = %s, %v; want the same %s", again, err, a)
	}
	owners, err := v.e.BlockOwners(v.ctx)
	if err != nil || owners[blocks[0]] != "h1" || len(owners) != 1 {
		t.Fatalf("BlockOwners = %v, %v", owners, err)
	}
	allocs, err := v.e.Allocations(v.ctx)
	if err != nil || len(allocs) != 1 || allocs[0].HandleID != "vxlan-tunnel-addr-h1" || allocs[0].Attrs[AttrType] != AttrTypeVXLANTunnel || allocs[0].Attrs["node"] != "" {
		t.Fatalf("allocations %+v, %v: want one tunnel address without a node attribute", allocs, err)
	}

	// The pool stops using VXLAN, another does: the address moves.
	moved, err := v.e.EnsureTunnelAddress(v.ctx, "h1", []netip.Prefix{pfx("10.2.0.0/16")})
	if err != nil || !pfx("10.2.0.0/16").Contains(moved) {
		t.Fatalf("moved tunnel address %s, %v", moved, err)
	}
	if ips, err := v.e.IPsByHandle(v.ctx, VXLANTunnelHandle("h1")); err != nil || len(ips) != 1 {
		t.Fatalf("handle holds %v, %v; want exactly the new address", ips, err)
	}

	if err := v.e.ReleaseTunnelAddress(v.ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if ips, err := v.e.IPsByHandle(v.ctx, VXLANTunnelHandle("h1")); err != nil || len(ips) != 0 {
		t.Fatalf("after release the handle holds %v, %v", ips, err)
	}
	if err := v.e.ReleaseTunnelAddress(v.ctx, "h1"); err != nil {
		t.Fatalf("releasing twice: %v", err)
	}
	if _, err := v.e.EnsureTunnelAddress(v.ctx, "h1", nil); err == nil {
		t.Fatal("a tunnel address without a VXLAN pool")
	}
	mustCheckClean(t, v.e, nil)

	// A pool whose only addresses are VTEPs can be deleted; a workload
	// address still blocks it.
	if _, err := v.e.EnsureTunnelAddress(v.ctx, "h2", []netip.Prefix{pfx("10.2.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	assignIn(t, v.e, "h3", "w1", "10.2.0.0/16")
	if err := v.e.DeletePool(v.ctx, "10.2.0.0/16"); err == nil {
		t.Fatal("deleted a pool with a workload address")
	} else {
		wantErr(t, err, ErrPoolInUse)
	}
	if err := v.e.ReleaseByHandle(v.ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := v.e.DeletePool(v.ctx, "10.2.0.0/16"); err != nil {
		t.Fatalf("deleting a pool holding only a VTEP address: %v", err)
	}
	if ips, err := v.e.IPsByHandle(v.ctx, VXLANTunnelHandle("h2")); err != nil || len(ips) != 0 {
		t.Fatalf("VTEP address survives its pool: %v %v", ips, err)
	}
	mustCheckClean(t, v.e, nil)
}
