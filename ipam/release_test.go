package ipam

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

func TestReleaseAndReuse(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/26", 26) // one block: reuse is forced once it is full
	v.pool("10.0.1.0/24", 0)
	var ips []netip.Addr
	for i := 0; i < 64; i++ {
		ips = append(ips, assignIn(t, v.e, "h1", "c"+itoa(i), "10.0.0.0/26"))
	}
	_, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "full", Within: ipnet("10.0.0.0/26")})
	wantErr(t, err, ErrExhausted)

	a, b := ips[10], ips[20]
	steps := []struct {
		name string
		ip   netip.Addr
		want error
	}{
		{"release", a, nil},
		{"release again is harmless", a, nil},
		{"release a second", b, nil},
		{"release a third", netip.MustParseAddr("10.0.0.63"), nil},
		{"never assigned, no block yet", netip.MustParseAddr("10.0.1.5"), nil},
		{"outside every pool", netip.MustParseAddr("10.9.9.9"), ErrNotInPool},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			err := v.e.ReleaseIP(v.ctx, toIP(s.ip))
			if s.want != nil {
				wantErr(t, err, s.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if rawExists(t, v.m.Store, handleKey("c10")) {
		t.Fatal("handle of a released address still exists")
	}
	// Freed ordinals are handed out in the order they were released.
	if got := assignIn(t, v.e, "h1", "n1", "10.0.0.0/26"); got != a {
		t.Fatalf("reuse: got %s, want %s (released first)", got, a)
	}
	if got := assignIn(t, v.e, "h1", "n2", "10.0.0.0/26"); got != b {
		t.Fatalf("reuse: got %s, want %s", got, b)
	}
	if got := assignIn(t, v.e, "h1", "n3", "10.0.0.0/26"); got != netip.MustParseAddr("10.0.0.63") {
		t.Fatalf("reuse: got %s, want 10.0.0.63", got)
	}
	if bs := hostBlocks(t, v.e, "h1"); len(bs) != 1 {
		t.Fatalf("reuse claimed blocks: %v", bs)
	}
	// A release by another process is seen by this engine's next assignment
	// even though its cached copy of the block says "full".
	other := v.engine(Options{})
	if err := other.ReleaseIP(v.ctx, toIP(ips[30])); err != nil {
		t.Fatal(err)
	}
	if got := assignIn(t, v.e, "h1", "n4", "10.0.0.0/26"); got != ips[30] {
		t.Fatalf("after a release elsewhere: got %s, want %s", got, ips[30])
	}
	mustCheckClean(t, v.e, nil)
}

func TestReleaseByHandle(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	v.pool("fd00:1::/120", 0)
	v4 := assign(t, v.e, "h1", "dual")
	v6 := assign6(t, v.e, "h1", "dual")
	// A third address of the same handle in a second block.
	extra := netip.MustParseAddr("10.0.0.200")
	if blockOf(extra, 26) == blockOf(v4, 26) {
		extra = netip.MustParseAddr("10.0.0.10")
	}
	if err := v.e.AssignIP(v.ctx, AssignIPArgs{IP: toIP(extra), Host: "h1", HandleID: "dual"}); err != nil {
		t.Fatal(err)
	}
	keep := assign(t, v.e, "h1", "keep")

	ips, err := v.e.IPsByHandle(v.ctx, "dual")
	if err != nil || len(ips) != 3 {
		t.Fatalf("IPsByHandle = %v, %v", ips, err)
	}
	got := map[string]bool{}
	for _, ip := range ips {
		got[ip.String()] = true
	}
	for _, want := range []netip.Addr{v4, v6, extra} {
		if !got[want.String()] {
			t.Fatalf("IPsByHandle %v misses %s", ips, want)
		}
	}
	var rec handleRecord
	if _, err := v.m.Store.GetJSON(v.ctx, handleKey("dual"), &rec); err != nil || rec.total() != 3 || len(rec.Blocks) != 3 {
		t.Fatalf("handle record %+v, %v", rec, err)
	}
	// Release from another process (no cache), twice.
	other := v.engine(Options{})
	for i := 0; i < 2; i++ {
		if err := other.ReleaseByHandle(v.ctx, "dual"); err != nil {
			t.Fatalf("ReleaseByHandle #%d: %v", i, err)
		}
	}
	if ips, _ := v.e.IPsByHandle(v.ctx, "dual"); len(ips) != 0 {
		t.Fatalf("still held after release: %v", ips)
	}
	if rawExists(t, v.m.Store, handleKey("dual")) {
		t.Fatal("handle record survived its release")
	}
	if ips, _ := v.e.IPsByHandle(v.ctx, "keep"); len(ips) != 1 || ips[0].String() != keep.String() {
		t.Fatalf("unrelated handle affected: %v", ips)
	}
	if err := v.e.ReleaseByHandle(v.ctx, "never-existed"); err != nil {
		t.Fatalf("unknown handle: %v", err)
	}
	mustCheckClean(t, v.e, nil)
}

func TestEmptyBlockGivenBack(t *testing.T) {
	cases := []struct {
		name      string
		grace     time.Duration
		immediate bool
	}{
		{"after the default grace period", 0, false},
		{"after a configured grace period", 5 * time.Minute, false},
		{"immediately", ReleaseImmediately, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			v := newEnv(t, Options{ReleaseGracePeriod: c.grace, Now: clock.Now})
			grace := c.grace
			if grace == 0 {
				grace = DefaultReleaseGracePeriod
			}
			v.pool("10.0.0.0/24", 0)
			a := assign(t, v.e, "h1", "a")
			b := assign(t, v.e, "h1", "b")
			blk := blockOf(a, 26)
			if err := v.e.ReleaseIP(v.ctx, toIP(a)); err != nil {
				t.Fatal(err)
			}
			clock.Advance(grace + time.Second)
			if n, err := v.e.ReleaseEmptyBlocks(v.ctx, "h1"); err != nil || n != 0 {
				t.Fatalf("a block with an address was released: %d, %v", n, err)
			}
			if err := v.e.ReleaseIP(v.ctx, toIP(b)); err != nil {
				t.Fatal(err)
			}
			if c.immediate {
				if rawExists(t, v.m.Store, blockKey(blk)) || rawExists(t, v.m.Store, affinityKey("h1", blk)) {
					t.Fatal("emptied block not released immediately")
				}
			} else {
				clock.Advance(grace / 2)
				if n, err := v.e.ReleaseEmptyBlocks(v.ctx, "h1"); err != nil || n != 0 {
					t.Fatalf("released inside the grace period: %d, %v", n, err)
				}
				if bs := hostBlocks(t, v.e, "h1"); len(bs) != 1 {
					t.Fatalf("host lost its block early: %v", bs)
				}
				clock.Advance(grace)
				if n, err := v.e.ReleaseEmptyBlocks(v.ctx, "h1"); err != nil || n != 1 {
					t.Fatalf("ReleaseEmptyBlocks after the grace period = %d, %v", n, err)
				}
			}
			if bs := hostBlocks(t, v.e, "h1"); len(bs) != 0 {
				t.Fatalf("host still owns %v", bs)
			}
			if rawExists(t, v.m.Store, blockKey(blk)) {
				t.Fatal("block record survived")
			}
			// The engine's cache must not resurrect the released block.
			c2 := assign(t, v.e, "h1", "c")
			if bs := hostBlocks(t, v.e, "h1"); len(bs) != 1 || !bs[0].Contains(c2) {
				t.Fatalf("new assignment %s, blocks %v", c2, bs)
			}
			mustCheckClean(t, v.e, nil)
		})
	}
}

func TestWatchHostBlocks(t *testing.T) {
	clock := newFakeClock()
	v := newEnv(t, Options{Now: clock.Now})
	v.pool("10.0.0.0/24", 0)
	first := blockOf(assign(t, v.e, "h1", "c0"), 26)

	ctx, cancel := context.WithCancel(v.ctx)
	defer cancel()
	events := v.e.WatchHostBlocks(ctx, "h1")
	next := func() BlockEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch closed")
			}
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no block event within 5s")
		}
		return BlockEvent{}
	}
	if ev := next(); !ev.Added || ev.Host != "h1" || ev.Block.String() != first.String() {
		t.Fatalf("initial event %+v, want Added %s", ev, first)
	}
	// Another host's claim is not ours.
	assign(t, v.engine(Options{}), "h2", "other")
	var last netip.Addr
	for i := 1; i <= 64; i++ {
		last = assign(t, v.e, "h1", "c"+itoa(i))
	}
	second := blockOf(last, 26)
	if ev := next(); !ev.Added || ev.Block.String() != second.String() {
		t.Fatalf("event %+v, want Added %s", ev, second)
	}
	if err := v.e.ReleaseIP(v.ctx, toIP(last)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if n, err := v.e.ReleaseEmptyBlocks(v.ctx, "h1"); err != nil || n != 1 {
		t.Fatalf("ReleaseEmptyBlocks = %d, %v", n, err)
	}
	if ev := next(); ev.Added || ev.Block.String() != second.String() {
		t.Fatalf("event %+v, want Removed %s", ev, second)
	}
	cancel()
	for range events {
	}
}
