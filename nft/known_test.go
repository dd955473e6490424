package nft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestInsertElementsIsCanonical: the elements a change adds one by one
// to a canonical set land where sorting and formatting the whole set
// would put them, addresses of both families and interface names alike.
func TestInsertElementsIsCanonical(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addr := func(f Family) string {
		if f == IPv6 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(r.IntN(40))}).String()
		}
		return netip.AddrFrom4([4]byte{10, byte(r.IntN(3)), byte(r.IntN(3)), byte(r.IntN(30))}).String()
	}
	for round := range 300 {
		f, typ := IPv4, SetAddr
		switch round % 3 {
		case 1:
			f = IPv6
		case 2:
			typ = SetIfname
		}
		elem := func() string {
			if typ == SetIfname {
				return fmt.Sprintf("cali%x", r.IntN(200))
			}
			return addr(f)
		}
		var initial []string
		for range r.IntN(50) + 1 {
			initial = append(initial, elem())
		}
		set, ok := canonicalSet(f, Set{Name: "s", Type: typ}, initial)
		if !ok {
			t.Fatalf("round %d: canonicalSet refused %v", round, initial)
		}
		var more []string
		for range r.IntN(fewElements) + 1 {
			more = append(more, elem())
		}
		got, ok := insertElements(f, set, more)
		if !ok {
			t.Fatalf("round %d: insertElements refused %v", round, more)
		}
		want, _ := canonicalSet(f, Set{Name: "s", Type: typ}, append(slices.Clone(set.Elements), more...))
		if !slices.Equal(got.Elements, want.Elements) {
			t.Fatalf("round %d: adding %v to %v gave\n%v, want\n%v", round, more, set.Elements, got.Elements, want.Elements)
		}
	}
}
