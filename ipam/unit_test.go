package ipam

import (
	"net/netip"
	"testing"
	"time"
)

func TestBlockWalkVisitsEveryBlockOnce(t *testing.T) {
	cases := []struct {
		span      string
		blockBits int
		want      int
	}{
		{"10.0.0.0/24", 26, 4},
		{"10.0.0.0/26", 26, 1},
		{"10.0.0.0/16", 26, 1024},
		{"fd00::/120", 122, 4},
		{"10.0.0.16/28", 26, 1}, // span smaller than a block: its block
	}
	for _, c := range cases {
		t.Run(c.span, func(t *testing.T) {
			sp := pfx(c.span)
			seen := map[netip.Prefix]bool{}
			walk := blockWalk(sp, c.blockBits, "host-a")
			var first netip.Prefix
			for p, ok := walk(); ok; p, ok = walk() {
				if !first.IsValid() {
					first = p
				}
				if p.Bits() != c.blockBits || p.Masked() != p {
					t.Fatalf("bad block %s", p)
				}
				if !p.Overlaps(sp) {
					t.Fatalf("block %s outside %s", p, sp)
				}
				if seen[p] {
					t.Fatalf("block %s twice", p)
				}
				seen[p] = true
			}
			if len(seen) != c.want {
				t.Fatalf("visited %d blocks, want %d", len(seen), c.want)
			}
			// Deterministic per host: the same host starts at the same block.
			again, _ := blockWalk(sp, c.blockBits, "host-a")()
			if again != first {
				t.Fatalf("start block not stable: %s then %s", first, again)
			}
		})
	}
}

func TestBlockWalkSpreadsHosts(t *testing.T) {
	starts := map[netip.Prefix]bool{}
	for _, h := range []string{"h1", "h2", "h3", "node-a", "node-b"} {
		p, _ := blockWalk(pfx("192.168.0.0/16"), 26, h)()
		starts[p] = true
	}
	if len(starts) < 4 {
		t.Fatalf("hosts start at the same blocks too often: %v", starts)
	}
}

func TestCIDREscaping(t *testing.T) {
	for _, s := range []string{"192.168.0.0/26", "fd00:1::/122", "10.0.0.0/8"} {
		p := pfx(s)
		got, ok := unescapeCIDR(escapeCIDR(p))
		if !ok || got != p {
			t.Fatalf("%s -> %q -> %s", s, escapeCIDR(p), got)
		}
	}
	if k := blockKey(pfx("192.168.0.0/26")); k != "ipam/blocks/192.168.0.0-26" {
		t.Fatalf("block key %q", k)
	}
	host, p, ok := parseAffinityKey(affinityKey("h1", pfx("fd00::40/122")))
	if !ok || host != "h1" || p != pfx("fd00::40/122") {
		t.Fatalf("affinity key round trip: %s %s %v", host, p, ok)
	}
}

func TestOrdinals(t *testing.T) {
	cases := []struct {
		block, addr string
		ord         int
	}{
		{"10.0.0.64/26", "10.0.0.64", 0},
		{"10.0.0.64/26", "10.0.0.127", 63},
		{"fd00::40/122", "fd00::7f", 63},
		{"10.0.16.0/20", "10.0.31.255", 4095},
	}
	for _, c := range cases {
		b, a := pfx(c.block), netip.MustParseAddr(c.addr)
		o, ok := ordinalOf(b, a)
		if !ok || o != c.ord {
			t.Fatalf("ordinalOf(%s, %s) = %d %v, want %d", b, a, o, ok, c.ord)
		}
		if got := nthAddr(b, o); got != a {
			t.Fatalf("nthAddr(%s, %d) = %s, want %s", b, o, got, a)
		}
	}
	if _, ok := ordinalOf(pfx("10.0.0.0/26"), netip.MustParseAddr("10.0.0.64")); ok {
		t.Fatal("address outside block got an ordinal")
	}
}

func TestBlockAllocateRelease(t *testing.T) {
	b := newBlock(pfx("10.0.0.0/26"), "h1")
	now := time.Unix(1000, 0)
	b.allocate(0, "a", map[string]string{"k": "v"})
	b.allocate(1, "b", nil)
	b.allocate(2, "a", map[string]string{"k": "v"})
	if len(b.Attributes) != 2 || b.used() != 3 {
		t.Fatalf("attributes %+v used %d", b.Attributes, b.used())
	}
	if o, _ := b.freeOrdinal(nil); o != 3 {
		t.Fatalf("next free %d, want 3", o)
	}
	lost := b.release([]int{0, 2}, now)
	if lost["a"] != 2 || len(b.Attributes) != 1 || b.Attributes[0].HandleID != "b" {
		t.Fatalf("after release: lost %v attrs %+v", lost, b.Attributes)
	}
	if h, _ := b.handleAt(1); h != "b" {
		t.Fatalf("ordinal 1 now held by %q after attribute compaction", h)
	}
	// Released ordinals go to the back of the queue.
	if b.Unallocated[len(b.Unallocated)-1] != 2 {
		t.Fatalf("released ordinal not queued last: %v", b.Unallocated[len(b.Unallocated)-3:])
	}
	if b.EmptiedAt != nil {
		t.Fatal("non-empty block marked emptied")
	}
	b.release([]int{1}, now)
	if !b.empty() || b.EmptiedAt == nil || !b.EmptiedAt.Equal(now) {
		t.Fatalf("empty block: emptiedAt %v", b.EmptiedAt)
	}
	w := pfx("10.0.0.16/28")
	if o, ok := b.freeOrdinal(&w); !ok || o != 16 {
		t.Fatalf("freeOrdinal within %s = %d", w, o)
	}
}
