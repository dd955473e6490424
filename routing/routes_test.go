package routing

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestDiffRoutes(t *testing.T) {
	a, b, c := addr("10.0.0.2"), addr("10.0.0.3"), addr("10.0.0.4")
	kernel := []KernelRoute{
		{Dst: pfx("192.168.1.0/26"), Gateways: []netip.Addr{a}},    // unchanged
		{Dst: pfx("192.168.2.0/26"), Gateways: []netip.Addr{a}},    // moves to b
		{Dst: pfx("192.168.3.0/26"), Gateways: []netip.Addr{c, b}}, // same ECMP set, other order
		{Dst: pfx("192.168.4.0/26"), Gateways: []netip.Addr{b, c}}, // ECMP shrinks
		{Dst: pfx("192.168.5.0/26"), Gateways: []netip.Addr{a}},    // withdrawn
	}
	desired := map[netip.Prefix][]netip.Addr{
		pfx("192.168.1.0/26"): {a},
		pfx("192.168.2.0/26"): {b},
		pfx("192.168.3.0/26"): {b, c},
		pfx("192.168.4.0/26"): {c},
		pfx("192.168.6.0/26"): {c, a, a}, // new, ECMP, duplicate next hop
		pfx("192.168.7.0/26"): {},        // no next hop: not a route
	}
	tests := []struct {
		name        string
		allowDelete bool
		wantDelete  []netip.Prefix
		wantKept    []netip.Prefix
	}{
		{"in sync: withdrawn routes go", true, []netip.Prefix{pfx("192.168.5.0/26")}, nil},
		{"restarting: withdrawn routes are kept", false, nil, []netip.Prefix{pfx("192.168.5.0/26")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := DiffRoutes(desired, kernel, tc.allowDelete)
			wantAdd := []KernelRoute{{Dst: pfx("192.168.6.0/26"), Gateways: []netip.Addr{a, c}}}
			wantReplace := []KernelRoute{
				{Dst: pfx("192.168.2.0/26"), Gateways: []netip.Addr{b}},
				{Dst: pfx("192.168.4.0/26"), Gateways: []netip.Addr{c}},
			}
			if fmt.Sprint(d.Add) != fmt.Sprint(wantAdd) {
				t.Errorf("Add = %v, want %v", d.Add, wantAdd)
			}
			if fmt.Sprint(d.Replace) != fmt.Sprint(wantReplace) {
				t.Errorf("Replace = %v, want %v", d.Replace, wantReplace)
			}
			if !slices.Equal(d.Delete, tc.wantDelete) {
				t.Errorf("Delete = %v, want %v", d.Delete, tc.wantDelete)
			}
			if !slices.Equal(d.Kept, tc.wantKept) {
				t.Errorf("Kept = %v, want %v", d.Kept, tc.wantKept)
			}
		})
	}
	t.Run("identical sets give an empty diff", func(t *testing.T) {
		d := DiffRoutes(map[netip.Prefix][]netip.Addr{pfx("192.168.1.0/26"): {a}}, kernel[:1], true)
		if !d.Empty() {
			t.Errorf("diff = %+v, want empty", d)
		}
	})
	t.Run("empty desired set with deletes allowed clears every learned route", func(t *testing.T) {
		d := DiffRoutes(nil, kernel, true)
		if len(d.Delete) != len(kernel) || len(d.Add)+len(d.Replace) != 0 {
			t.Errorf("diff = %+v", d)
		}
	})
}

// fakeTable is a RouteTable over a map, with routes of other protocols that
// must never be touched.
type fakeTable struct {
	learned map[netip.Prefix][]netip.Addr
	foreign map[netip.Prefix]bool
	ops     []string
}

func (f *fakeTable) ListLearned(context.Context) ([]KernelRoute, error) {
	var out []KernelRoute
	for d, g := range f.learned {
		out = append(out, KernelRoute{Dst: d, Gateways: g})
	}
	return out, nil
}

func (f *fakeTable) Add(_ context.Context, r KernelRoute) error {
	if f.foreign[r.Dst] || f.learned[r.Dst] != nil {
		return fmt.Errorf("%w: %s", ErrRouteConflict, r.Dst)
	}
	f.learned[r.Dst] = r.Gateways
	f.ops = append(f.ops, "add "+r.Dst.String())
	return nil
}

func (f *fakeTable) Replace(_ context.Context, r KernelRoute) error {
	if f.foreign[r.Dst] {
		return fmt.Errorf("%w: %s", ErrRouteConflict, r.Dst)
	}
	f.learned[r.Dst] = r.Gateways
	f.ops = append(f.ops, "replace "+r.Dst.String())
	return nil
}

func (f *fakeTable) Delete(_ context.Context, d netip.Prefix) error {
	delete(f.learned, d)
	f.ops = append(f.ops, "delete "+d.String())
	return nil
}

func TestApplyDiffReportsConflicts(t *testing.T) {
	ft := &fakeTable{
		learned: map[netip.Prefix][]netip.Addr{pfx("192.168.5.0/26"): {addr("10.0.0.2")}},
		foreign: map[netip.Prefix]bool{pfx("192.168.0.0/26"): true}, // our blackhole
	}
	desired := map[netip.Prefix][]netip.Addr{
		pfx("192.168.0.0/26"): {addr("10.0.0.3")},
		pfx("192.168.1.0/26"): {addr("10.0.0.3")},
	}
	kernel, _ := ft.ListLearned(context.Background())
	conflicts, err := ApplyDiff(context.Background(), ft, DiffRoutes(desired, kernel, true), logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(conflicts, []netip.Prefix{pfx("192.168.0.0/26")}) {
		t.Errorf("conflicts = %v", conflicts)
	}
	if want := []string{"add 192.168.1.0/26", "delete 192.168.5.0/26"}; !slices.Equal(ft.ops, want) {
		t.Errorf("ops = %v, want %v", ft.ops, want)
	}
}
