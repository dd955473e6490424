package ipam

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
)

// TestColdPathKeepsUnchangedBlocks: a cold claim lists every block; the
// host's blocks it already holds, unchanged since, are taken from its cache
// instead of being decoded again (a map per stamped address), and a block
// another process changed is decoded afresh.
func TestColdPathKeepsUnchangedBlocks(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	// Three full blocks and one address of a fourth: the host's cache has
	// seen a reload (at each claim) and its own writes.
	var first netip.Addr
	for i := range 3*64 + 1 {
		a := assign(t, v.e, "h1", fmt.Sprintf("c%d", i))
		if i == 0 {
			first = a
		}
	}
	kvs, err := v.m.Store.List(v.ctx, blocksPrefix)
	if err != nil || len(kvs) != 4 {
		t.Fatalf("blocks: %d, %v", len(kvs), err)
	}
	all := v.e.decodeListed(kvs)
	if len(all) != 4 {
		t.Fatalf("decodeListed gave %d blocks, want 4", len(all))
	}
	for _, kv := range kvs {
		var c cachedBlock
		for _, x := range all {
			if blockKey(x.b.prefix) == kv.Key {
				c = x
			}
		}
		if c.b == nil || c.rev != kv.ModRevision || !bytes.Equal(c.b.value(), kv.Value) {
			t.Fatalf("%s: decodeListed gave %+v at %d, not the record at %d", kv.Key, c.b, c.rev, kv.ModRevision)
		}
	}
	// Decoding four blocks of 64 stamped addresses takes thousands of
	// allocations; taking them from the cache, a handful.
	if n := testing.AllocsPerRun(5, func() { v.e.decodeListed(kvs) }); n > 50 {
		t.Errorf("decodeListed of 4 unchanged cached blocks: %.0f allocations, want them taken from the cache", n)
	}

	// Another process releases the first address: its block's record
	// changed, and what decodeListed gives says so.
	if err := v.engine(Options{}).ReleaseIP(v.ctx, toIP(first)); err != nil {
		t.Fatal(err)
	}
	if kvs, err = v.m.Store.List(v.ctx, blocksPrefix); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range v.e.decodeListed(kvs) {
		if !c.b.prefix.Contains(first) {
			continue
		}
		found = true
		ord, _ := ordinalOf(c.b.prefix, first)
		if h, held := c.b.handleAt(ord); held {
			t.Errorf("block %s from decodeListed still gives %s to %s, released by another process", c.b.CIDR, first, h)
		}
	}
	if !found {
		t.Errorf("no block holds %s", first)
	}
}

// TestCloneEncodesAsTheOriginal: a block's copy writes the same record, so
// a copy cached after a write is recognised in the next listing (see
// decodeListed); a full block's empty free list stays "[]".
func TestCloneEncodesAsTheOriginal(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/26", 0)
	for i := range 64 {
		assign(t, v.e, "h1", fmt.Sprintf("c%d", i))
	}
	kvs, err := v.m.Store.List(v.ctx, blocksPrefix)
	if err != nil || len(kvs) != 1 {
		t.Fatalf("blocks: %d, %v", len(kvs), err)
	}
	b, err := decodeBlock(kvs[0].Key, kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.clone().value(); !bytes.Equal(got, kvs[0].Value) {
		t.Errorf("clone of a full block encodes as\n%s\nnot as the record\n%s", got, kvs[0].Value)
	}
}
