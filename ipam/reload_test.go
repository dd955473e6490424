package ipam

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
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
	all := v.e.decodeListed(kvs, affinityOf("h1"))
	if len(all) != 4 {
		t.Fatalf("decodeListed gave %d blocks, want 4", len(all))
	}
	for _, kv := range kvs {
		var c cachedBlock
		for _, x := range all {
			if blockKey(x.b.prefix) == kv.Key {
				c = x.cachedBlock
			}
		}
		if c.b == nil || c.rev != kv.ModRevision || !bytes.Equal(c.b.value(), kv.Value) {
			t.Fatalf("%s: decodeListed gave %+v at %d, not the record at %d", kv.Key, c.b, c.rev, kv.ModRevision)
		}
	}
	// Decoding four blocks of 64 stamped addresses takes thousands of
	// allocations; taking them from the cache, a handful.
	if n := testing.AllocsPerRun(5, func() { v.e.decodeListed(kvs, affinityOf("h1")) }); n > 50 {
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
	for _, c := range v.e.decodeListed(kvs, affinityOf("h1")) {
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

// TestColdPathDecodesOtherHostsBlocksOnlyToBorrow: in a listing, another
// host's blocks are kept as their records with the affinity read from the
// record's head; they decode to exactly the record when the host borrows,
// and a record of another shape is decoded whole.
func TestColdPathDecodesOtherHostsBlocksOnlyToBorrow(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	h2 := v.engine(Options{}) // another daemon: v.e has none of its blocks cached
	for i := range 64 + 1 {
		assign(t, h2, "h2", fmt.Sprintf("c%d", i))
	}
	assign(t, v.e, "h1", "mine")
	kvs, err := v.m.Store.List(v.ctx, blocksPrefix)
	if err != nil || len(kvs) != 3 {
		t.Fatalf("blocks: %d, %v", len(kvs), err)
	}
	all := v.e.decodeListed(kvs, affinityOf("h1"))
	if len(all) != 3 {
		t.Fatalf("decodeListed gave %d blocks, want 3", len(all))
	}
	for _, kv := range kvs {
		b, err := decodeBlock(kv.Key, kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		l, ok := all[b.prefix]
		if !ok {
			t.Fatalf("%s missing from the listing", kv.Key)
		}
		if l.affinity != b.Affinity || l.rev != kv.ModRevision || l.host() != b.host() {
			t.Errorf("%s: listed with affinity %q at %d, want %q at %d", kv.Key, l.affinity, l.rev, b.Affinity, kv.ModRevision)
		}
		if lazy := l.b == nil; lazy != (b.host() == "h2") {
			t.Errorf("%s of %s: decoded %v, want only h1's blocks decoded", kv.Key, b.host(), !lazy)
		}
		got, err := l.decoded()
		if err != nil || !bytes.Equal(got.value(), kv.Value) || got.prefix != b.prefix {
			t.Errorf("%s decodes to %v (%v), not the record", kv.Key, got, err)
		}
	}
	// Another writer's field order: decoded whole, same answer.
	b, err := decodeBlock(kvs[0].Key, kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	reordered := []byte(`{"affinity":"` + b.Affinity + `"` + strings.TrimPrefix(string(kvs[0].Value), `{"cidr":"`+b.CIDR+`","affinity":"`+b.Affinity+`"`))
	reordered = append(reordered[:len(reordered)-1], []byte(`,"cidr":"`+b.CIDR+`"}`)...)
	other := v.e.decodeListed([]datastore.KV{{Key: kvs[0].Key, Value: reordered, ModRevision: kvs[0].ModRevision}}, affinityOf("h1"))
	if l := other[b.prefix]; l.b == nil || l.affinity != b.Affinity || !bytes.Equal(l.b.value(), kvs[0].Value) {
		t.Errorf("a record with the affinity first: listed as %+v, want it decoded whole", l)
	}
}

// TestPeekBlockHead: the head of the encoder's records is read; any other
// shape, or an escaped string, is left to the full decoder.
func TestPeekBlockHead(t *testing.T) {
	tests := []struct {
		raw            string
		cidr, affinity string
		ok             bool
	}{
		{`{"cidr":"10.0.0.0/26","affinity":"host:h1","allocations":[]}`, "10.0.0.0/26", "host:h1", true},
		{`{"cidr":"10.0.0.0/26","affinity":"","allocations":[]}`, "10.0.0.0/26", "", true},
		{`{"cidr":"10.0.0.0/26","affinity":null,"allocations":[]}`, "10.0.0.0/26", "", true},
		{`{"cidr":"10.0.0.0/26","affinity":"host:h\u0031"}`, "", "", false},
		{`{"cidr":"10.0.0.0/26", "affinity":"host:h1"}`, "", "", false},
		{`{"affinity":"host:h1","cidr":"10.0.0.0/26"}`, "", "", false},
		{`{"cidr":"10.0.0.0/26","affinity":"host:h1`, "", "", false},
		{`{"cidr":"10.0.0.0/26"}`, "", "", false},
		{`{"cidr":"10.0.0.0/26","affinity":"host:\"x"}`, "", "", false},
		{"{\"cidr\":\"10.0.0.0/26\",\"affinity\":\"host:\x01\"}", "", "", false},
		{``, "", "", false},
	}
	for _, tt := range tests {
		cidr, affinity, ok := peekBlockHead([]byte(tt.raw))
		if cidr != tt.cidr || affinity != tt.affinity || ok != tt.ok {
			t.Errorf("peekBlockHead(%s) = %q, %q, %v; want %q, %q, %v", tt.raw, cidr, affinity, ok, tt.cidr, tt.affinity, tt.ok)
		}
	}
}
