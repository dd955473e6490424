package ipam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// TestBlockJSONMatchesEncodingJSON: the hand-written block encoder writes
// the bytes encoding/json writes from the field tags, for empty, nil,
// partly and fully assigned blocks and for strings that need escaping.
func TestBlockJSONMatchesEncodingJSON(t *testing.T) {
	// plainBlock has block's fields and tags but not its MarshalJSON.
	type plainBlock block
	odd := []string{"", "web-1", `quo"te`, `back\slash`, "<script>&", "tab\tnew\nline", "ünï", "sep\u2028\u2029", "bad\xffutf8", "\x00\x1f", "héllo>"}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return odd[rng.IntN(len(odd))] }
	blocks := []*block{
		{},
		{Attributes: []attribute{}},
		newBlock(netip.MustParsePrefix("10.0.0.0/26"), "h1"),
		newBlock(netip.MustParsePrefix("fd00::/122"), ""),
	}
	for n := range 200 {
		b := newBlock(netip.MustParsePrefix("10.1.0.0/28"), pick())
		for o := range blockAddrCount(b.prefix) {
			if rng.IntN(3) == 0 {
				continue
			}
			var attrs map[string]string
			switch rng.IntN(3) {
			case 1:
				attrs = map[string]string{AttrAssigned: time.Unix(int64(n), int64(o)).UTC().Format(time.RFC3339Nano)}
			case 2:
				attrs = map[string]string{pick(): pick(), pick(): pick(), "z": "last", "a": "first"}
			}
			b.allocate(o, fmt.Sprintf("%s-%d", pick(), rng.IntN(4)), attrs)
		}
		if n%2 == 0 {
			b.release([]int{0, 3, 5}, time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)))
		}
		if n%5 == 0 {
			b.release(b.ordinalsOf(b.Attributes[0].HandleID), time.Unix(0, 0))
		}
		blocks = append(blocks, b, b.clone())
		// A block read back from its record encodes its attributes from
		// what decodeBlock kept, not from the ones allocate made.
		read, err := decodeBlock("block", b.value())
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, read)
	}
	for i, b := range blocks {
		want, err := json.Marshal((*plainBlock)(b))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block %d:\n got %s\nwant %s", i, got, want)
		}
		if v := b.value(); !bytes.Equal(v, want) {
			t.Fatalf("block %d value():\n got %s\nwant %s", i, v, want)
		}
	}
}

// TestBlockCloneIsIndependent: changing a clone (assigning, releasing,
// relabelling) leaves the original's record as it was.
func TestBlockCloneIsIndependent(t *testing.T) {
	b := newBlock(netip.MustParsePrefix("10.0.0.0/29"), "h1")
	b.allocate(0, "a", map[string]string{"k": "v"})
	b.allocate(1, "b", nil)
	before := string(b.value())
	c := b.clone()
	c.allocate(2, "c", map[string]string{"k": "w"})
	c.relabel(0, map[string]string{"k": "changed"})
	c.release([]int{1}, time.Unix(0, 0))
	if after := string(b.value()); after != before {
		t.Fatalf("original changed by its clone:\n%s\nwas\n%s", after, before)
	}
}
