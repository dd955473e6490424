package ipam

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// fakeClock lets tests cross the release grace period instantly.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	t   testing.TB
	m   *etcdtest.Member
	e   *Engine
	ctx context.Context
}

func newEnv(t testing.TB, opts Options) *env {
	t.Helper()
	m := etcdtest.Start(t)
	if opts.Log == nil {
		opts.Log = quietLog()
	}
	return &env{t: t, m: m, e: New(m.Store, opts), ctx: context.Background()}
}

// engine is another host's daemon: its own client, cache and counters.
func (v *env) engine(opts Options) *Engine {
	if opts.Log == nil {
		opts.Log = quietLog()
	}
	return New(v.m.Client(v.t), opts)
}

func (v *env) pool(cidr string, blockSize int) Pool {
	v.t.Helper()
	p, err := v.e.AddPool(v.ctx, Pool{CIDR: cidr, BlockSize: blockSize})
	if err != nil {
		v.t.Fatalf("AddPool(%s): %v", cidr, err)
	}
	return p
}

func (v *env) config(c Config) {
	v.t.Helper()
	if err := v.e.SetConfig(v.ctx, c); err != nil {
		v.t.Fatalf("SetConfig: %v", err)
	}
}

func assign(t testing.TB, e *Engine, host, handle string) netip.Addr {
	t.Helper()
	n, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: handle})
	if err != nil {
		t.Fatalf("AutoAssign(%s, %s): %v", host, handle, err)
	}
	return addrOf(t, n)
}

func assign6(t testing.TB, e *Engine, host, handle string) netip.Addr {
	t.Helper()
	n, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: handle, IPv6: true})
	if err != nil {
		t.Fatalf("AutoAssign v6(%s, %s): %v", host, handle, err)
	}
	return addrOf(t, n)
}

func addrOf(t testing.TB, n net.IPNet) netip.Addr {
	t.Helper()
	a, ok := addrFromIP(n.IP)
	ones, bits := n.Mask.Size()
	if !ok || ones != bits {
		t.Fatalf("assignment %v is not a single-address network", n)
	}
	return a
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func ipnet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func hostBlocks(t testing.TB, e *Engine, host string) []netip.Prefix {
	t.Helper()
	ns, err := e.HostBlocks(context.Background(), host)
	if err != nil {
		t.Fatalf("HostBlocks(%s): %v", host, err)
	}
	out := make([]netip.Prefix, len(ns))
	for i := range ns {
		p, err := prefixFromIPNet(&ns[i])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}

// rawBlock reads a block record straight from etcd.
func rawBlock(t testing.TB, s *datastore.Store, p netip.Prefix) (*block, bool) {
	t.Helper()
	kv, err := s.Get(context.Background(), blockKey(p))
	if errors.Is(err, datastore.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeBlock(kv.Key, kv.Value)
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

func rawExists(t testing.TB, s *datastore.Store, key string) bool {
	t.Helper()
	_, err := s.Get(context.Background(), key)
	if errors.Is(err, datastore.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func wantErr(t testing.TB, err error, kinds ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("want error %v, got nil", kinds)
	}
	for _, k := range kinds {
		if !errors.Is(err, k) {
			t.Fatalf("want errors.Is(%v), got %v", k, err)
		}
	}
}

// rulesOf are leak rules that trust isLive alone (nil: no leak check):
// every node's Docker counts as asked, and no age is required.
func rulesOf(isLive func(string) bool) *LeakRules {
	if isLive == nil {
		return nil
	}
	return &LeakRules{
		Now:      time.Now(),
		InUse:    func(a Allocation) bool { return isLive(a.HandleID) },
		Verified: func(string) bool { return true },
	}
}

func mustCheckClean(t testing.TB, e *Engine, isLive func(string) bool) {
	t.Helper()
	r, err := e.Check(context.Background(), rulesOf(isLive))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if r.Problems() != 0 {
		t.Fatalf("Check found problems: %+v", r)
	}
}

func netipToIP(s string) net.IP { return toIP(netip.MustParseAddr(s)) }

func assignIn(t testing.TB, e *Engine, host, handle, within string) netip.Addr {
	t.Helper()
	n, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: handle, Within: ipnet(within)})
	if err != nil {
		t.Fatalf("AutoAssign(%s, %s, within %s): %v", host, handle, within, err)
	}
	return addrOf(t, n)
}
