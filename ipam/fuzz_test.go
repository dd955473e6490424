package ipam

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// FuzzNormalizePool checks the pool validation every pool goes through
// (AddPool, `calico-cnm pool add`, RequestPool with calico.create-pool):
// arbitrary CIDR strings, block sizes and IPIP modes never panic; a rejection
// is an ErrInvalidCIDR (or, for a mode, ErrInvalidArgument) with a one-line message; an accepted pool is
// canonical, in range, clear of the reserved ranges, and normalizing it again
// changes nothing.
func FuzzNormalizePool(f *testing.F) {
	f.Fuzz(func(t *testing.T, cidr string, blockSize int, ipip string) {
		p, pfx, err := normalizePool(Pool{CIDR: cidr, BlockSize: blockSize, IPIPMode: ipip})
		if err != nil {
			if !errors.Is(err, ErrInvalidCIDR) && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("normalizePool(%q, %d, %q): error %q is neither ErrInvalidCIDR nor ErrInvalidArgument", cidr, blockSize, ipip, err)
			}
			if msg := err.Error(); msg == "" || strings.Contains(msg, "\n") {
				t.Fatalf("normalizePool(%q): error is not one line: %q", cidr, msg)
			}
			return
		}
		if p.CIDR != pfx.String() || pfx != pfx.Masked() || !pfx.IsValid() {
			t.Fatalf("normalizePool(%q) = %q / %v: not canonical", cidr, p.CIDR, pfx)
		}
		maxBits := 32
		minBlock := minBlockSizeIPv4
		if pfx.Addr().Is6() {
			maxBits, minBlock = 128, minBlockSizeIPv6
		}
		if p.BlockSize < minBlock || p.BlockSize > maxBits || p.BlockSize < pfx.Bits() {
			t.Fatalf("normalizePool(%q, %d) accepted block size /%d for %s", cidr, blockSize, p.BlockSize, pfx)
		}
		for _, r := range reservedRanges {
			if r.prefix.Overlaps(pfx) {
				t.Fatalf("normalizePool accepted %s, which overlaps the %s", pfx, r.why)
			}
		}
		again, pfx2, err := normalizePool(p)
		if err != nil || again != p || pfx2 != pfx {
			t.Fatalf("normalizePool is not idempotent on %+v: %+v %v %v", p, again, pfx2, err)
		}
		if q, err := parseCIDR(p.CIDR); err != nil || q != pfx {
			t.Fatalf("parseCIDR(%q) = %v, %v after normalizePool accepted it", p.CIDR, q, err)
		}
	})
}

// FuzzAddPool adds arbitrary pools to a real engine on a real etcd that
// already holds one pool (10.0.0.0/16, so overlaps are exercised). A
// rejected pool leaves the datastore untouched, byte for byte; an accepted
// one is exactly what normalizePool made of the input and is listed, and is
// deleted again so that every input starts from the same state.
func FuzzAddPool(f *testing.F) {
	v := newEnv(f, Options{})
	ctx := context.Background()
	base := netip.MustParsePrefix("10.0.0.0/16")
	if _, err := v.e.AddPool(ctx, Pool{CIDR: base.String()}); err != nil {
		f.Fatal(err)
	}
	snapshot := func(t *testing.T) map[string]string {
		t.Helper()
		kvs, err := v.m.Store.List(ctx, "")
		if err != nil {
			t.Fatalf("listing the datastore: %v", err)
		}
		out := make(map[string]string, len(kvs))
		for _, kv := range kvs {
			out[kv.Key] = string(kv.Value)
		}
		return out
	}
	f.Fuzz(func(t *testing.T, cidr string, blockSize int, nat, disabled bool, ipip string) {
		before := snapshot(t)
		in := Pool{CIDR: cidr, BlockSize: blockSize, NATOutgoing: nat, Disabled: disabled, IPIPMode: ipip}
		want, wantPfx, normErr := normalizePool(in)
		got, err := v.e.AddPool(ctx, in)
		if err != nil {
			if msg := err.Error(); msg == "" || strings.Contains(msg, "\n") {
				t.Fatalf("AddPool(%+v): error is not one line: %q", in, msg)
			}
			if normErr == nil && !wantPfx.Overlaps(base) {
				t.Fatalf("AddPool(%+v) refused a valid pool that does not overlap %s: %v", in, base, err)
			}
			if normErr == nil && !errors.Is(err, ErrPoolOverlap) {
				t.Fatalf("AddPool(%+v) overlapping %s failed with %v, want ErrPoolOverlap", in, base, err)
			}
			if after := snapshot(t); !reflect.DeepEqual(before, after) {
				t.Fatalf("rejected AddPool(%+v) (%v) changed the datastore:\nbefore %v\nafter  %v", in, err, before, after)
			}
			return
		}
		if normErr != nil {
			t.Fatalf("AddPool(%+v) accepted what normalizePool rejects: %v", in, normErr)
		}
		if got != want {
			t.Fatalf("AddPool(%+v) = %+v, want %+v", in, got, want)
		}
		if wantPfx.Overlaps(base) {
			t.Fatalf("AddPool accepted %s, which overlaps the existing pool %s", got.CIDR, base)
		}
		stored, err := v.e.GetPool(ctx, got.CIDR)
		if err != nil || stored != got {
			t.Fatalf("GetPool(%s) after AddPool = %+v, %v; want %+v", got.CIDR, stored, err, got)
		}
		if err := v.e.DeletePool(ctx, got.CIDR); err != nil {
			t.Fatalf("DeletePool(%s): %v", got.CIDR, err)
		}
	})
}
