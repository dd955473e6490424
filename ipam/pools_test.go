package ipam

import (
	"strings"
	"testing"
)

func TestPoolValidationAndOverlap(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/16", 0)

	cases := []struct {
		name      string
		pool      Pool
		wantErr   []error
		wantMsg   string
		wantBlock int
	}{
		{name: "ipv4 default block size", pool: Pool{CIDR: "10.1.0.0/16"}, wantBlock: 26},
		{name: "ipv6 default block size", pool: Pool{CIDR: "fd00:1::/64"}, wantBlock: 122},
		{name: "small pool becomes one block", pool: Pool{CIDR: "10.2.0.0/28"}, wantBlock: 28},
		{name: "explicit block size", pool: Pool{CIDR: "10.3.0.0/16", BlockSize: 24, VXLANMode: "CrossSubnet"}, wantBlock: 24},
		{name: "garbage", pool: Pool{CIDR: "ten-dot-zero"}, wantErr: []error{ErrInvalidCIDR}},
		{name: "host bits set", pool: Pool{CIDR: "10.4.0.5/16"}, wantErr: []error{ErrInvalidCIDR}, wantMsg: "did you mean 10.4.0.0/16"},
		{name: "link local", pool: Pool{CIDR: "169.254.0.0/16"}, wantErr: []error{ErrInvalidCIDR}, wantMsg: "169.254.1.1"},
		{name: "multicast", pool: Pool{CIDR: "224.0.0.0/24"}, wantErr: []error{ErrInvalidCIDR}},
		{name: "ipv6 link local", pool: Pool{CIDR: "fe80::/64"}, wantErr: []error{ErrInvalidCIDR}},
		{name: "block too big", pool: Pool{CIDR: "10.5.0.0/16", BlockSize: 19}, wantErr: []error{ErrInvalidCIDR}, wantMsg: "between /20 and /32"},
		{name: "pool smaller than block", pool: Pool{CIDR: "10.6.0.0/28", BlockSize: 26}, wantErr: []error{ErrInvalidCIDR}, wantMsg: "smaller than its block size"},
		{name: "ipv6 block too big", pool: Pool{CIDR: "fd00:2::/64", BlockSize: 100}, wantErr: []error{ErrInvalidCIDR}},
		{name: "bad ipip mode", pool: Pool{CIDR: "10.7.0.0/16", IPIPMode: "Sometimes"}, wantErr: []error{ErrInvalidArgument}, wantMsg: "not supported"},
		{name: "ipip always refused", pool: Pool{CIDR: "10.7.0.0/16", IPIPMode: "Always"}, wantErr: []error{ErrInvalidArgument}, wantMsg: "no IP-in-IP data path"},
		{name: "ipip crosssubnet refused", pool: Pool{CIDR: "10.7.0.0/16", IPIPMode: "CrossSubnet"}, wantErr: []error{ErrInvalidArgument}, wantMsg: "--vxlan-mode"},
		{name: "bad vxlan mode", pool: Pool{CIDR: "10.7.0.0/16", VXLANMode: "Sometimes"}, wantErr: []error{ErrInvalidArgument}, wantMsg: "Never, Always, CrossSubnet"},
		{name: "vxlan on ipv6", pool: Pool{CIDR: "fd00:3::/64", VXLANMode: "Always"}, wantErr: []error{ErrInvalidArgument}, wantMsg: "IPv4 pools only"},
		{name: "inside existing", pool: Pool{CIDR: "10.0.5.0/24"}, wantErr: []error{ErrPoolOverlap}, wantMsg: "existing pool 10.0.0.0/16"},
		{name: "around existing", pool: Pool{CIDR: "10.0.0.0/8"}, wantErr: []error{ErrPoolOverlap}, wantMsg: "10.0.0.0/16"},
		{name: "same as existing", pool: Pool{CIDR: "10.0.0.0/16"}, wantErr: []error{ErrPoolOverlap, ErrPoolExists}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := v.e.AddPool(v.ctx, c.pool)
			if len(c.wantErr) > 0 {
				wantErr(t, err, c.wantErr...)
				if !strings.Contains(err.Error(), c.wantMsg) {
					t.Fatalf("message %q does not mention %q", err, c.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("AddPool: %v", err)
			}
			if p.BlockSize != c.wantBlock {
				t.Fatalf("block size %d, want %d", p.BlockSize, c.wantBlock)
			}
			got, err := v.e.GetPool(v.ctx, c.pool.CIDR)
			if err != nil || got != p {
				t.Fatalf("GetPool = %+v, %v; want %+v", got, err, p)
			}
		})
	}
	ps, err := v.e.ListPools(v.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.CIDR)
	}
	if got := strings.Join(names, " "); got != "10.0.0.0/16 10.1.0.0/16 10.2.0.0/28 10.3.0.0/16 fd00:1::/64" {
		t.Fatalf("ListPools order: %s", got)
	}
	if _, err := v.e.GetPool(v.ctx, "10.99.0.0/16"); err == nil {
		t.Fatal("GetPool of unknown pool succeeded")
	} else {
		wantErr(t, err, ErrPoolNotFound)
	}
	found, err := v.e.FindPool(v.ctx, ipnet("10.0.7.0/24"))
	if err != nil || found.CIDR != "10.0.0.0/16" {
		t.Fatalf("FindPool(10.0.7.0/24) = %+v, %v", found, err)
	}
	_, err = v.e.FindPool(v.ctx, ipnet("10.0.0.0/8"))
	wantErr(t, err, ErrPoolNotFound)
}

func TestEnsureDefaultPool(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("fd00:9::/64", 0) // an IPv6 pool does not count

	p, err := v.e.EnsureDefaultPool(v.ctx)
	if err != nil || p.CIDR != DefaultPoolIPv4 || p.BlockSize != 26 {
		t.Fatalf("EnsureDefaultPool = %+v, %v", p, err)
	}
	// A second daemon asking again gets the same pool.
	p2, err := v.engine(Options{}).EnsureDefaultPool(v.ctx)
	if err != nil || p2 != p {
		t.Fatalf("second EnsureDefaultPool = %+v, %v", p2, err)
	}
	if err := v.e.SetPoolDisabled(v.ctx, DefaultPoolIPv4, true); err != nil {
		t.Fatal(err)
	}
	_, err = v.e.EnsureDefaultPool(v.ctx)
	wantErr(t, err, ErrPoolDisabled)
	v.pool("10.0.0.0/16", 0)
	p, err = v.e.EnsureDefaultPool(v.ctx)
	if err != nil || p.CIDR != "10.0.0.0/16" {
		t.Fatalf("EnsureDefaultPool with another enabled pool = %+v, %v", p, err)
	}
}

func TestPoolDisableAndDelete(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	ip := assign(t, v.e, "h1", "c1")

	// Disabled by another process: this engine's cached pool is stale, and
	// its warm path must still notice (the pool revision guard).
	admin := v.engine(Options{})
	if err := admin.SetPoolDisabled(v.ctx, "10.0.0.0/24", true); err != nil {
		t.Fatal(err)
	}
	_, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "c2"})
	wantErr(t, err, ErrPoolDisabled)
	err = v.e.AssignIP(v.ctx, AssignIPArgs{IP: netipToIP("10.0.0.200"), Host: "h1", HandleID: "c3"})
	wantErr(t, err, ErrPoolDisabled)
	if err := admin.SetPoolDisabled(v.ctx, "10.0.0.0/24", false); err != nil {
		t.Fatal(err)
	}

	err = admin.DeletePool(v.ctx, "10.0.0.0/24")
	wantErr(t, err, ErrPoolInUse)
	if !strings.Contains(err.Error(), ip.String()) {
		t.Fatalf("ErrPoolInUse should name an address: %v", err)
	}
	if p, _ := admin.GetPool(v.ctx, "10.0.0.0/24"); p.Disabled {
		t.Fatal("refused deletion left the pool disabled")
	}
	if err := v.e.ReleaseIP(v.ctx, toIP(ip)); err != nil {
		t.Fatal(err)
	}
	blk := hostBlocks(t, v.e, "h1")
	if len(blk) != 1 {
		t.Fatalf("host blocks %v", blk)
	}
	if err := admin.DeletePool(v.ctx, "10.0.0.0/24"); err != nil {
		t.Fatalf("DeletePool of an empty pool: %v", err)
	}
	if _, err := v.e.GetPool(v.ctx, "10.0.0.0/24"); err == nil {
		t.Fatal("pool still there")
	}
	if rawExists(t, v.m.Store, blockKey(blk[0])) || rawExists(t, v.m.Store, affinityKey("h1", blk[0])) {
		t.Fatal("deleted pool left its block or affinity behind")
	}
	wantErr(t, admin.DeletePool(v.ctx, "10.0.0.0/24"), ErrPoolNotFound)
	// With no pool the first engine creates the default one again.
	if got := assign(t, v.e, "h1", "c4"); !pfx(DefaultPoolIPv4).Contains(got) {
		t.Fatalf("address %s outside the default pool", got)
	}
	mustCheckClean(t, v.e, nil)
}

func TestPoolEncapModes(t *testing.T) {
	v := newEnv(t, Options{})
	p, err := v.e.AddPool(v.ctx, Pool{CIDR: "10.8.0.0/16", VXLANMode: "always", IPIPMode: "never"})
	if err != nil {
		t.Fatalf("AddPool: %v", err)
	}
	if p.VXLANMode != EncapAlways || p.IPIPMode != "" || !p.Encapsulates() {
		t.Fatalf("modes not canonical: %+v", p)
	}
	cases := []struct {
		mode    string
		want    string
		wantErr error
	}{
		{mode: "CrossSubnet", want: EncapCrossSubnet},
		{mode: "never", want: EncapNever},
		{mode: "", want: EncapNever},
		{mode: "Always", want: EncapAlways},
		{mode: "sometimes", wantErr: ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			got, err := v.e.SetPoolVXLANMode(v.ctx, "10.8.0.0/16", c.mode)
			if c.wantErr != nil {
				wantErr(t, err, c.wantErr)
				stored, err := v.e.GetPool(v.ctx, "10.8.0.0/16")
				if err != nil || stored.VXLAN() != EncapAlways {
					t.Fatalf("a refused change altered the pool: %+v, %v", stored, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetPoolVXLANMode(%q): %v", c.mode, err)
			}
			stored, err := v.e.GetPool(v.ctx, "10.8.0.0/16")
			if err != nil || stored != got || stored.VXLAN() != c.want {
				t.Fatalf("stored %+v (%v), returned %+v; want mode %s", stored, err, got, c.want)
			}
		})
	}
	if _, err := v.e.SetPoolVXLANMode(v.ctx, "10.9.0.0/16", "Always"); err == nil {
		t.Fatal("changing an unknown pool succeeded")
	} else {
		wantErr(t, err, ErrPoolNotFound)
	}
	if _, err := v.e.AddPool(v.ctx, Pool{CIDR: "fd00:9::/64"}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.e.SetPoolVXLANMode(v.ctx, "fd00:9::/64", "CrossSubnet"); err == nil || !strings.Contains(err.Error(), "IPv4 pools only") {
		t.Fatalf("VXLAN on an IPv6 pool: %v", err)
	}
}

func TestTunnelHandle(t *testing.T) {
	h := VXLANTunnelHandle("host-a")
	if h != "vxlan-tunnel-addr-host-a" {
		t.Fatalf("handle %q", h)
	}
	for _, c := range []struct {
		h    string
		node string
		ok   bool
	}{{h, "host-a", true}, {"vxlan-tunnel-addr-", "", false}, {"ep-1234", "", false},
		{WireGuardTunnelHandle("host-b"), "host-b", true}, {"wireguard-tunnel-addr-", "", false}} {
		if n, ok := TunnelHandleNode(c.h); n != c.node || ok != c.ok {
			t.Errorf("TunnelHandleNode(%q) = %q, %v", c.h, n, ok)
		}
	}
}
