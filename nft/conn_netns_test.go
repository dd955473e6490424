package nft

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/calico-cnm/calico-cnm/internal/netnstest"
)

// binding is one published port of the ports-like table below.
type binding struct {
	hostPort, port uint16
	to             string
}

// portsLike is a table shaped like the published ports' (package ports):
// fib, DNAT, address and prefix matches, masquerade, base chains of the nat
// and filter types, ordered and unordered rules.
func portsLike(f Family, bs []binding) Table {
	pre := Chain{Name: "prerouting", Base: &BaseChain{Type: "nat", Hook: "prerouting", Priority: -100},
		Rules: []Rule{{Matches: []Match{{Kind: MatchFibLocal}}, Verdict: Jump, Target: "published", Comment: "to a local address"}}}
	post := Chain{Name: "postrouting", Base: &BaseChain{Type: "nat", Hook: "postrouting", Priority: 100}}
	raw := Chain{Name: "raw", Base: &BaseChain{Type: "filter", Hook: "prerouting", Priority: -300}}
	internal := Chain{Name: "internal", Base: &BaseChain{Type: "filter", Hook: "forward", Priority: 0}}
	pool := "fd00:1::/64"
	if f == IPv4 {
		pool = "10.66.0.0/16"
		post.Rules = []Rule{{Matches: []Match{{Kind: MatchCtDNAT}, {Kind: MatchIfname, Value: "cali", Prefix: true}, {Kind: MatchAddr, In: true, Value: "127.0.0.0/8"}}, Verdict: Masquerade}}
		raw.Rules = []Rule{{Matches: []Match{{Kind: MatchIfname, In: true, Value: "cali", Prefix: true}, {Kind: MatchAddr, Value: "127.0.0.0/8"}}, Verdict: Drop}}
	}
	internal.Rules = []Rule{
		{Matches: []Match{{Kind: MatchIfname, In: true, Value: "cali0123456789a"}, {Kind: MatchAddr, Value: pool}}, Verdict: Accept},
		{Matches: []Match{{Kind: MatchIfname, In: true, Value: "cali0123456789a"}}, Verdict: Drop},
	}
	pub := Chain{Name: "published"}
	for _, b := range bs {
		to := netip.MustParseAddr(b.to)
		if FamilyOf(to) != f {
			continue
		}
		self := Match{Kind: MatchAddr, Value: netip.PrefixFrom(to, to.BitLen()).String()}
		tcp := []Match{{Kind: MatchL4Proto, Proto: 6}, {Kind: MatchPort, Min: b.hostPort, Max: b.hostPort}}
		pub.Unordered = append(pub.Unordered, Rule{Matches: tcp, Verdict: DNAT, NATAddr: to, NATPort: b.port})
		post.Unordered = append(post.Unordered, Rule{Matches: []Match{{Kind: MatchAddr, In: true, Value: self.Value}, self}, Verdict: Masquerade})
	}
	return Table{Family: f, Chains: []Chain{pre, post, raw, internal, pub}}
}

// policyLike is a table shaped like the policy's: sets, a base chain and
// a chain (ref) jumping to another (target), unless without.
func policyLike(f Family, without bool) Table {
	addrs := []string{"192.168.0.1", "192.168.0.2"}
	if f == IPv6 {
		addrs = []string{"fd00::1", "fd00::2"}
	}
	t := Table{Family: f, Sets: []Set{{Name: "members", Type: SetAddr, Elements: addrs}, {Name: "workloads", Type: SetIfname, Elements: []string{"cali0123456789a"}}}}
	fwd := Chain{Name: "forward", Base: &BaseChain{Type: "filter", Hook: "forward", Priority: 0},
		Rules: []Rule{{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept}}}
	if !without {
		fwd.Unordered = []Rule{{Matches: []Match{{Kind: MatchIfnameSet, Value: "workloads"}}, Verdict: Jump, Target: "b-ref"}}
		t.Chains = append(t.Chains,
			Chain{Name: "b-ref", Rules: []Rule{{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: "members"}}, Verdict: Goto, Target: "a-target"}}},
			Chain{Name: "a-target", Rules: []Rule{{Verdict: Accept, Comment: "allowed"}}})
	}
	t.Chains = append(t.Chains, fwd)
	return t
}

func both(mk func(Family) Table) Ruleset {
	return Ruleset{Tables: []Table{mk(IPv4), mk(IPv6)}}
}

// TestConnAppliesTablesIntegration: two tables of different names share
// one Conn; each Apply changes only what differs in its own table (counted
// exactly: a change that fell back to a rewrite would count every rule),
// what the kernel reads back equals what was written for every match kind
// (after Resync, Apply finds nothing to do), and one table's changes never
// touch the other.
func TestConnAppliesTablesIntegration(t *testing.T) {
	ns := netnstest.NewNamed(t, "nfttest", "the nftables encoder, decoder and diff against the kernel")
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	c, err := New("/var/run/netns/"+ns, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	ports, policy := c.Tables("t-ports"), c.Tables("t-policy")
	a := []binding{{8080, 80, "10.66.0.5"}, {8080, 80, "fd00:1::5"}}
	ab := append(a, binding{9090, 90, "10.66.0.6"})
	b := ab[2:]

	steps := []struct {
		name    string
		tables  *Tables
		want    Ruleset
		changes int // -1: some
	}{
		{"ports from nothing", ports, both(func(f Family) Table { return portsLike(f, a) }), -1},
		{"policy from nothing", policy, both(func(f Family) Table { return policyLike(f, false) }), -1},
		{"a binding added: its DNAT and its masquerade", ports, both(func(f Family) Table { return portsLike(f, ab) }), 2},
		{"the first bindings removed (one per family)", ports, both(func(f Family) Table { return portsLike(f, b) }), 4},
		{"a chain and the chain it jumps to removed, with the jump (per family)", policy, both(func(f Family) Table { return policyLike(f, true) }), 6},
		{"the ip6 table no longer wanted", ports, Ruleset{Tables: []Table{portsLike(IPv4, b)}}, 1},
	}
	for _, st := range steps {
		other := policy
		if st.tables == policy {
			other = ports
		}
		before, err := other.Dump(ctx, IPv4, IPv6)
		if err != nil {
			t.Fatal(err)
		}
		n, err := st.tables.Apply(ctx, st.want)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if (st.changes < 0 && n == 0) || (st.changes >= 0 && n != st.changes) {
			t.Errorf("%s: %d changes, want %d", st.name, n, st.changes)
		}
		// The kernel's tables, read back, are exactly the wanted ones.
		st.tables.Resync()
		if n, err := st.tables.Apply(ctx, st.want); err != nil || n != 0 {
			got, _ := st.tables.Dump(ctx, IPv4, IPv6)
			t.Errorf("%s: after a resync, %d changes (%v); the kernel has\n%s\nwant\n%s", st.name, n, err, got.Render(), st.want.Render())
		}
		after, err := other.Dump(ctx, IPv4, IPv6)
		if err != nil {
			t.Fatal(err)
		}
		if before.Render() != after.Render() {
			t.Errorf("%s changed table %s:\n%s\nnow\n%s", st.name, other.Name(), before.Render(), after.Render())
		}
	}
	if err := ports.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := ports.Dump(ctx, IPv4, IPv6); err != nil || len(got.Tables) != 0 {
		t.Errorf("after Delete: %v, %v", got.Render(), err)
	}
	if got, err := policy.Dump(ctx, IPv4, IPv6); err != nil || len(got.Tables) != 2 {
		t.Errorf("deleting t-ports took t-policy: %v, %v", got.Render(), err)
	}
}

// endsAfter is a context that ends once its Err has been asked n times:
// between the reading of the kernel and the change, as a daemon that stops
// at that moment would.
type endsAfter struct {
	context.Context
	asked atomic.Int32
	n     int32
}

func (c *endsAfter) Err() error {
	if c.asked.Add(1) > c.n {
		return context.Canceled
	}
	return nil
}

// TestConnApplyCancelledIsQuiet: an Apply whose context ends after it read
// the kernel (the daemon stopping during its first Apply) returns the
// context's error, logs no warning and leaves the kernel as it was; it
// once warned that the update failed and tried a rewrite.
func TestConnApplyCancelledIsQuiet(t *testing.T) {
	ns := netnstest.NewNamed(t, "nfttest", "the nftables encoder, decoder and diff against the kernel")
	log, hook := logtest.NewNullLogger()
	c, err := New("/var/run/netns/"+ns, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ports := c.Tables("t-ports")
	// The context ends right after the kernel is read: as many asks as a
	// Dump of both families makes, counted here.
	counting := &endsAfter{Context: context.Background(), n: 1 << 30}
	if _, err := ports.Dump(counting, IPv4, IPv6); err != nil {
		t.Fatal(err)
	}
	ctx := &endsAfter{Context: context.Background(), n: counting.asked.Load()}
	_, err = ports.Apply(ctx, both(func(f Family) Table { return portsLike(f, []binding{{8080, 80, "10.66.0.5"}}) }))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Apply with a context that ended = %v, want context.Canceled", err)
	}
	if ctx.asked.Load() <= ctx.n {
		t.Fatalf("the context was asked %d times: Apply never got past reading the kernel, so this test proves nothing", ctx.asked.Load())
	}
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("logged at %s: %s (%v)", e.Level, e.Message, e.Data)
		}
	}
	if got, err := ports.Dump(context.Background(), IPv4, IPv6); err != nil || len(got.Tables) != 0 {
		t.Errorf("the kernel has %d of the tables after a cancelled Apply (%v), want none", len(got.Tables), err)
	}
}
