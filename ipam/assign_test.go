package ipam

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// The first assignment on a host, with no pool configured, creates the
// default pool and claims one /26 of it for the host: the first block of the
// host's walk (blockWalk: a start derived from the host name, then
// consecutive blocks, as Calico does), and hands out its first address.
func TestFirstAssignmentClaimsOneBlock(t *testing.T) {
	v := newEnv(t, Options{})
	ip := assign(t, v.e, "h1", "c1")

	p, err := v.e.GetPool(v.ctx, DefaultPoolIPv4)
	if err != nil {
		t.Fatalf("default pool not created on first use: %v", err)
	}
	want, _ := blockWalk(pfx(p.CIDR), 26, "h1")()
	blocks := hostBlocks(t, v.e, "h1")
	if len(blocks) != 1 || blocks[0] != want {
		t.Fatalf("host blocks %v, want [%s]", blocks, want)
	}
	if ip != want.Addr() {
		t.Fatalf("first address %s, want %s (every address of a block is usable)", ip, want.Addr())
	}
	b, ok := rawBlock(t, v.m.Store, want)
	if !ok || b.Affinity != "host:h1" || b.used() != 1 {
		t.Fatalf("block record %+v", b)
	}
	var aff affinityRecord
	if _, err := v.m.Store.GetJSON(v.ctx, affinityKey("h1", want), &aff); err != nil || aff.State != stateConfirmed {
		t.Fatalf("affinity %+v, %v", aff, err)
	}
	var h handleRecord
	if _, err := v.m.Store.GetJSON(v.ctx, handleKey("c1"), &h); err != nil || h.Blocks[want.String()] != 1 {
		t.Fatalf("handle %+v, %v", h, err)
	}
	mustCheckClean(t, v.e, nil)
}

func TestSixtyFifthAssignmentClaimsSecondBlock(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.10.0.0/16", 0)
	seen := map[netip.Addr]bool{}
	for i := 0; i < 64; i++ {
		ip := assign(t, v.e, "h1", "c"+itoa(i))
		if seen[ip] {
			t.Fatalf("duplicate %s", ip)
		}
		seen[ip] = true
	}
	first := hostBlocks(t, v.e, "h1")
	if len(first) != 1 {
		t.Fatalf("after 64 assignments: blocks %v, want exactly one", first)
	}
	for ip := range seen {
		if !first[0].Contains(ip) {
			t.Fatalf("%s outside the host's block %s", ip, first[0])
		}
	}
	ip := assign(t, v.e, "h1", "c64")
	blocks := hostBlocks(t, v.e, "h1")
	if len(blocks) != 2 {
		t.Fatalf("after 65 assignments: blocks %v, want two", blocks)
	}
	second := blocks[0]
	if second == first[0] {
		second = blocks[1]
	}
	if !second.Contains(ip) {
		t.Fatalf("65th address %s not in the new block %s", ip, second)
	}
}

func TestHostsNeverShareABlock(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/22", 0)
	hosts := []string{"h1", "h2", "h3"}
	engines := map[string]*Engine{}
	for _, h := range hosts {
		engines[h] = v.engine(Options{})
	}
	got := map[string][]netip.Addr{}
	for i := 0; i < 70; i++ {
		for _, h := range hosts {
			got[h] = append(got[h], assign(t, engines[h], h, h+"-"+itoa(i)))
		}
	}
	owner := map[netip.Prefix]string{}
	for _, h := range hosts {
		bs := hostBlocks(t, v.e, h)
		if len(bs) != 2 {
			t.Fatalf("%s owns %v, want 2 blocks for 70 addresses", h, bs)
		}
		for _, b := range bs {
			if o, dup := owner[b]; dup {
				t.Fatalf("block %s owned by %s and %s", b, o, h)
			}
			owner[b] = h
		}
		for _, ip := range got[h] {
			if owner[blockOf(ip, 26)] != h {
				t.Fatalf("%s got %s outside its own blocks while the pool had free blocks", h, ip)
			}
		}
	}
	usage, err := v.e.Usage(v.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range usage {
		if u.Host != owner[pfx(u.CIDR)] || u.Pool != "10.0.0.0/22" || u.Size != 64 {
			t.Fatalf("usage row %+v, owner %s", u, owner[pfx(u.CIDR)])
		}
	}
	mustCheckClean(t, v.e, nil)
}

// Borrowing: with no free block left, a host takes a free address from a
// block affine to another host (unless strictAffinity).
func TestBorrowingAndStrictAffinity(t *testing.T) {
	cases := []struct {
		name   string
		strict bool
	}{
		{"borrows", false},
		{"strictAffinity refuses", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newEnv(t, Options{})
			v.pool("10.0.0.0/26", 26) // a single block
			cfg := DefaultConfig()
			cfg.StrictAffinity = c.strict
			v.config(cfg)
			h1, h2 := v.engine(Options{}), v.engine(Options{})
			ip1 := assign(t, h1, "h1", "a")
			n, err := h2.AutoAssign(v.ctx, AutoAssignArgs{Host: "h2", HandleID: "b"})
			if c.strict {
				wantErr(t, err, ErrExhausted)
				for _, s := range []string{"strictAffinity", "h2", "10.0.0.0/26"} {
					if !strings.Contains(err.Error(), s) {
						t.Fatalf("error %q does not mention %s", err, s)
					}
				}
				err = h2.AssignIP(v.ctx, AssignIPArgs{IP: netipToIP("10.0.0.9"), Host: "h2", HandleID: "b"})
				wantErr(t, err, ErrStrictAffinity)
				mustCheckClean(t, v.e, nil)
				return
			}
			if err != nil {
				t.Fatalf("borrowing: %v", err)
			}
			ip2 := addrOf(t, n)
			if !pfx("10.0.0.0/26").Contains(ip2) || ip2 == ip1 {
				t.Fatalf("borrowed %s (h1 has %s)", ip2, ip1)
			}
			if bs := hostBlocks(t, v.e, "h2"); len(bs) != 0 {
				t.Fatalf("borrowing gave h2 blocks %v", bs)
			}
			allocs, err := v.e.Allocations(v.ctx)
			if err != nil || len(allocs) != 2 || allocs[1].Host != "h1" || allocs[1].HandleID != "b" {
				t.Fatalf("allocations %+v, %v", allocs, err)
			}
			for i := 0; i < 62; i++ {
				assign(t, h2, "h2", "b"+itoa(i))
			}
			_, err = h2.AutoAssign(v.ctx, AutoAssignArgs{Host: "h2", HandleID: "full"})
			wantErr(t, err, ErrExhausted)
			if !strings.Contains(err.Error(), "no block has a free address") {
				t.Fatalf("exhaustion message: %v", err)
			}
			mustCheckClean(t, v.e, nil)
		})
	}
}

func TestConfigLimits(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		fill  int // addresses h1 takes first
		want  []error
		msg   string
		other bool // whether another host can still get an address
	}{
		{name: "maxBlocksPerHost", cfg: Config{AutoAllocateBlocks: true, MaxBlocksPerHost: 1}, fill: 64, want: []error{ErrMaxBlocks, ErrExhausted}, msg: "maxBlocksPerHost", other: true},
		{name: "autoAllocateBlocks off", cfg: Config{AutoAllocateBlocks: false}, fill: 0, want: []error{ErrExhausted}, msg: "autoAllocateBlocks is off", other: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newEnv(t, Options{})
			v.pool("10.0.0.0/24", 0)
			v.config(c.cfg)
			got, err := v.e.GetConfig(v.ctx)
			if err != nil || got != c.cfg {
				t.Fatalf("GetConfig = %+v, %v", got, err)
			}
			for i := 0; i < c.fill; i++ {
				assign(t, v.e, "h1", "c"+itoa(i))
			}
			_, err = v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "over"})
			wantErr(t, err, c.want...)
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("message %q lacks %q", err, c.msg)
			}
			_, err = v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h2", HandleID: "other"})
			if (err == nil) != c.other {
				t.Fatalf("other host: err %v, want success=%v", err, c.other)
			}
		})
	}
	v := newEnv(t, Options{})
	if c, err := v.e.GetConfig(v.ctx); err != nil || c != DefaultConfig() {
		t.Fatalf("default config %+v, %v", c, err)
	}
	wantErr(t, v.e.SetConfig(v.ctx, Config{MaxBlocksPerHost: -1}), ErrInvalidArgument)
}

func TestAssignSpecificIP(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	v.pool("10.1.0.0/24", 0)
	if err := v.e.SetPoolDisabled(v.ctx, "10.1.0.0/24", true); err != nil {
		t.Fatal(err)
	}
	h2 := v.engine(Options{})
	steps := []struct {
		name   string
		e      *Engine
		ip     string
		host   string
		handle string
		want   error
	}{
		{"free address claims its block", v.e, "10.0.0.77", "h1", "a", nil},
		{"taken by another handle", h2, "10.0.0.77", "h2", "b", ErrAddressInUse},
		{"same handle again is a no-op", v.e, "10.0.0.77", "h1", "a", nil},
		{"outside every pool", v.e, "10.9.9.9", "h1", "c", ErrNotInPool},
		{"disabled pool", v.e, "10.1.0.5", "h1", "d", ErrPoolDisabled},
		{"in another host's block (no strictAffinity)", h2, "10.0.0.78", "h2", "e", nil},
		{"network address of a block is usable", h2, "10.0.0.128", "h2", "f", nil},
		{"missing handle", v.e, "10.0.0.3", "h1", "", ErrInvalidArgument},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			err := s.e.AssignIP(v.ctx, AssignIPArgs{IP: netipToIP(s.ip), Host: s.host, HandleID: s.handle, Attrs: map[string]string{"container": s.handle}})
			if s.want != nil {
				wantErr(t, err, s.want)
				return
			}
			if err != nil {
				t.Fatalf("AssignIP(%s): %v", s.ip, err)
			}
		})
	}
	if bs := hostBlocks(t, v.e, "h1"); len(bs) != 1 || bs[0] != pfx("10.0.0.64/26") {
		t.Fatalf("h1 blocks %v, want [10.0.0.64/26]", bs)
	}
	if bs := hostBlocks(t, v.e, "h2"); len(bs) != 1 || bs[0] != pfx("10.0.0.128/26") {
		t.Fatalf("h2 blocks %v, want [10.0.0.128/26] (claimed by the specific assignment)", bs)
	}
	// Auto-assignment never hands out the specifically assigned addresses.
	for i := 0; i < 62; i++ {
		ip := assign(t, v.e, "h1", "auto"+itoa(i))
		if ip == netip.MustParseAddr("10.0.0.77") || ip == netip.MustParseAddr("10.0.0.78") {
			t.Fatalf("auto-assigned the taken %s", ip)
		}
		if !pfx("10.0.0.64/26").Contains(ip) {
			t.Fatalf("%s outside h1's block while it had room", ip)
		}
	}
	ips, err := v.e.IPsByHandle(v.ctx, "a")
	if err != nil || len(ips) != 1 || ips[0].String() != "10.0.0.77" {
		t.Fatalf("IPsByHandle(a) = %v, %v", ips, err)
	}
	allocs, _ := v.e.Allocations(v.ctx)
	for _, a := range allocs {
		if a.HandleID == "a" && a.Attrs["container"] != "a" {
			t.Fatalf("attributes lost: %+v", a)
		}
	}
	mustCheckClean(t, v.e, nil)
}

// Hosts racing for the last free blocks: each block is claimed exactly once.
func TestClaimRace(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0) // 4 blocks
	const hosts = 4
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, hosts)
	for i := 0; i < hosts; i++ {
		e, host := v.engine(Options{}), "h"+itoa(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: host})
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	owner := map[netip.Prefix]string{}
	for i := 0; i < hosts; i++ {
		h := "h" + itoa(i)
		bs := hostBlocks(t, v.e, h)
		if len(bs) != 1 {
			t.Fatalf("%s owns %v, want exactly one block", h, bs)
		}
		if o, dup := owner[bs[0]]; dup {
			t.Fatalf("block %s claimed by %s and %s", bs[0], o, h)
		}
		owner[bs[0]] = h
	}
	// The pool has no free block left: a fifth host borrows.
	ip := assign(t, v.engine(Options{}), "h9", "h9")
	if _, ok := owner[blockOf(ip, 26)]; !ok {
		t.Fatalf("h9 got %s outside every claimed block", ip)
	}
	mustCheckClean(t, v.e, nil)
}

func TestWithinSubnet(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/16", 0)
	cases := []struct {
		within string
		want   error
	}{
		{"10.0.7.0/24", nil},
		{"10.0.9.16/28", nil}, // smaller than a block
		{"10.0.0.0/16", nil},
		{"10.5.0.0/16", ErrPoolNotFound},
	}
	for _, c := range cases {
		t.Run(c.within, func(t *testing.T) {
			for i := 0; i < 3; i++ {
				n, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: c.within + itoa(i), Within: ipnet(c.within)})
				if c.want != nil {
					wantErr(t, err, c.want)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if ip := addrOf(t, n); !pfx(c.within).Contains(ip) {
					t.Fatalf("%s outside %s", ip, c.within)
				}
			}
		})
	}
	_, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "x", IPv6: true, Within: ipnet("10.0.0.0/16")})
	wantErr(t, err, ErrInvalidArgument)
}

func TestIPv6Pool(t *testing.T) {
	v := newEnv(t, Options{})
	_, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "x", IPv6: true})
	wantErr(t, err, ErrPoolNotFound)
	p := v.pool("fd00:10::/64", 0)
	if p.BlockSize != 122 {
		t.Fatalf("IPv6 default block size %d", p.BlockSize)
	}
	for i := 0; i < 65; i++ {
		n, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "c" + itoa(i), IPv6: true})
		if err != nil {
			t.Fatal(err)
		}
		if ones, bits := n.Mask.Size(); ones != 128 || bits != 128 {
			t.Fatalf("IPv6 address handed out as %v", n)
		}
		if ip := addrOf(t, n); !pfx("fd00:10::/64").Contains(ip) {
			t.Fatalf("%s outside the pool", ip)
		}
	}
	bs := hostBlocks(t, v.e, "h1")
	if len(bs) != 2 || bs[0].Bits() != 122 || bs[1].Bits() != 122 {
		t.Fatalf("IPv6 blocks %v, want two /122", bs)
	}
	// IPv4 and IPv6 live side by side; a v4 request does not use v6 blocks.
	v.pool("10.0.0.0/24", 0)
	if ip := assign(t, v.e, "h1", "v4"); !ip.Is4() {
		t.Fatalf("IPv4 request got %s", ip)
	}
	mustCheckClean(t, v.e, nil)
}

// The warm path (the host owns a block with room) is one etcd transaction
// and no read, and so is releasing an address the engine assigned.
func TestWarmPathIsOneTransaction(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/16", 0)
	assign(t, v.e, "h1", "first")
	before := v.m.Store.Stats()
	var ips []netip.Addr
	for i := 0; i < 20; i++ {
		ips = append(ips, assign(t, v.e, "h1", "c"+itoa(i)))
	}
	after := v.m.Store.Stats()
	if txns, reads := after.Txns-before.Txns, after.Reads-before.Reads; txns != 20 || reads != 0 {
		t.Fatalf("20 warm assignments took %d transactions and %d reads, want 20 and 0", txns, reads)
	}
	before = after
	for _, ip := range ips {
		if err := v.e.ReleaseIP(v.ctx, toIP(ip)); err != nil {
			t.Fatal(err)
		}
	}
	after = v.m.Store.Stats()
	if txns, reads := after.Txns-before.Txns, after.Reads-before.Reads; txns != 20 || reads != 0 {
		t.Fatalf("20 releases took %d transactions and %d reads, want 20 and 0", txns, reads)
	}
	mustCheckClean(t, v.e, nil)
}

var _ = datastore.ErrConflict

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// A claim is one transaction: the block, its affinity already confirmed
// (what routing acts on) and the handle, with no pending record confirmed
// by a second write; and two reads, made at once.
func TestClaimIsOneTransaction(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/16", 0)
	assign(t, v.e, "h0", "warm-up") // the pool and config reads are cached after this
	before := v.m.Store.Stats()
	assign(t, v.e, "h1", "c1")
	after := v.m.Store.Stats()
	// The reads: the host's affinities and the blocks (at once); the
	// configuration is the one the warm-up read, guarded in the transaction.
	if txns, reads := after.Txns-before.Txns, after.Reads-before.Reads; txns != 1 || reads != 2 {
		t.Errorf("a first assignment on a host (a block claim) took %d transactions and %d reads, want 1 and 2", txns, reads)
	}
	blocks := hostBlocks(t, v.e, "h1")
	var aff affinityRecord
	if len(blocks) != 1 {
		t.Fatalf("h1 blocks %v", blocks)
	}
	if _, err := v.m.Store.GetJSON(v.ctx, affinityKey("h1", blocks[0]), &aff); err != nil || aff.State != stateConfirmed {
		t.Fatalf("affinity %+v, %v", aff, err)
	}
}
