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

// TestBecomes: the remembered state takes a Ruleset's set elements only
// when they are exactly the kernel's after the change, in canonical order.
func TestBecomes(t *testing.T) {
	names, _ := elementOrder(SetIfname)
	addrs, _ := elementOrder(SetAddr)
	tests := []struct {
		name         string
		has, changes []string
		to           []string
		del          bool
		before       func(a, b string) bool
		want         bool
	}{
		{"one added in place", []string{"cali1", "cali3"}, []string{"cali2"}, []string{"cali1", "cali2", "cali3"}, false, names, true},
		{"added out of order", []string{"cali1", "cali3"}, []string{"cali2"}, []string{"cali2", "cali1", "cali3"}, false, names, false},
		{"added twice", []string{"cali1"}, []string{"cali2"}, []string{"cali1", "cali2", "cali2"}, false, names, false},
		{"an old one missing", []string{"cali1", "cali3"}, []string{"cali2"}, []string{"cali2", "cali3"}, false, names, false},
		{"an added one missing", []string{"cali1"}, []string{"cali2", "cali4"}, []string{"cali1", "cali2"}, false, names, false},
		{"addresses by address, not text", []string{"10.0.0.9", "10.0.0.30"}, []string{"10.0.0.10"}, []string{"10.0.0.9", "10.0.0.10", "10.0.0.30"}, false, addrs, true},
		{"addresses in text order", []string{"10.0.0.9", "10.0.0.30"}, []string{"10.0.0.10"}, []string{"10.0.0.10", "10.0.0.30", "10.0.0.9"}, false, addrs, false},
		{"one deleted", []string{"cali1", "cali2", "cali3"}, []string{"cali2"}, []string{"cali1", "cali3"}, true, names, true},
		{"deleted but still there", []string{"cali1", "cali2"}, []string{"cali2"}, []string{"cali1", "cali2"}, true, names, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := becomes(tc.has, tc.changes, tc.to, tc.del, tc.before); got != tc.want {
				t.Errorf("becomes(%v, %v, %v, del %v) = %v, want %v", tc.has, tc.changes, tc.to, tc.del, got, tc.want)
			}
		})
	}
}

// TestBecomesCostsNothingPerElement: adding one interface to a set of a
// thousand (a Join on a full host) allocates the same few maps as adding
// it to a set of two; it once built a map of every element, each Join.
func TestBecomesCostsNothingPerElement(t *testing.T) {
	names, _ := elementOrder(SetIfname)
	allocs := func(n int) float64 {
		var has []string
		for i := range n {
			has = append(has, fmt.Sprintf("cali%05d", 2*i))
		}
		added := fmt.Sprintf("cali%05d", 2*(n/2)+1)
		to := slices.Insert(slices.Clone(has), n/2+1, added)
		if !becomes(has, []string{added}, to, false, names) {
			t.Fatalf("with %d elements: the added element in order is not recognised", n)
		}
		return testing.AllocsPerRun(20, func() { becomes(has, []string{added}, to, false, names) })
	}
	if small, large := allocs(2), allocs(1000); large > small {
		t.Errorf("becomes allocates %.0f times with 1000 elements, %.0f with 2: it should not grow with the set", large, small)
	}
}

// TestCanonicalSetOfANewSet: a set added whole is made canonical (sorted,
// each element once, of the table's family), however few its elements.
func TestCanonicalSetOfANewSet(t *testing.T) {
	got, ok := canonicalSet(IPv4, Set{Name: "s", Type: SetAddr, Elements: []string{"10.0.0.2", "10.0.0.1", "10.0.0.1"}}, nil)
	if !ok || !slices.Equal(got.Elements, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("canonicalSet = %v, %v; want [10.0.0.1 10.0.0.2]", got.Elements, ok)
	}
	if _, ok := canonicalSet(IPv4, Set{Name: "s", Type: SetAddr, Elements: []string{"fd00::1"}}, nil); ok {
		t.Error("canonicalSet took an IPv6 address into an ip table's set")
	}
}
