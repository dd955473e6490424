package policy

import (
	"fmt"
	"github.com/calico-cnm/calico-cnm/nft"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// scaleState: 1000 joined local endpoints (labels role=r0..r9) and
// policies selecting all of them, each with three rules.
func scaleState(b *testing.B, policies int) State {
	st := baseState()
	st.Endpoints = nil
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("%064x", i+1)
		e := datastore.Endpoint{ID: id, Network: net1ID, Node: "h1", IPv4: fmt.Sprintf("192.168.%d.%d/32", i/250, i%250+1), HostIfName: "cali" + id[53:], Joined: true,
			Labels: map[string]string{"role": fmt.Sprintf("r%d", i%10)}}
		st.Endpoints = append(st.Endpoints, e)
	}
	for p := 0; p < policies; p++ {
		ps, err := api.Decode(strings.NewReader(fmt.Sprintf(`apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: p%d}
spec:
  order: %d
  selector: has(role)
  ingress:
  - {action: Allow, protocol: TCP, source: {selector: "role == 'r%d'"}, destination: {ports: [%d]}}
  - {action: Log}
  - {action: Pass, source: {nets: [10.%d.0.0/16]}}
`, p, p, p%10, 1000+p, p)))
		if err != nil {
			b.Fatal(err)
		}
		st.Policies = append(st.Policies, ps...)
	}
	return st
}

// BenchmarkDesiredJoin is the computation a Join waits for at 1000 local
// endpoints: the desired tables and the plan against the tables as NFT
// last programmed them (one endpoint fewer, in Dump's shape with
// handles), without and with 50 policies selecting every endpoint.
func BenchmarkDesiredJoin(b *testing.B) {
	for _, n := range []int{0, 50} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			st := scaleState(b, n)
			before := st
			before.Endpoints = st.Endpoints[:len(st.Endpoints)-1]
			prev, _ := Desired(before)
			cur := programmed(b, prev)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				want, _ := Desired(st)
				if ops := Diff(cur, want); len(ops) == 0 {
					b.Fatal("no change")
				}
			}
		})
	}
}

// programmed is rs as NFT remembers it after writing it into empty
// tables: Dump's shape, every rule with a handle.
func programmed(tb testing.TB, rs Ruleset) Ruleset {
	tb.Helper()
	ops := Diff(Ruleset{}, rs)
	handles := map[int]uint64{}
	for i, op := range ops {
		if op.Kind == OpAddRule {
			handles[i] = uint64(i + 1)
		}
	}
	out, ok := nft.AfterOps(Ruleset{}, ops, handles)
	if !ok {
		tb.Fatal("nft.AfterOps could not follow writing the tables")
	}
	return out
}

// BenchmarkCalculatorJoin is BenchmarkDesiredJoin through the incremental
// Calculator: one endpoint's record changes (it joins, then leaves, in
// turn) and the tables are computed and diffed against the previous ones.
func BenchmarkCalculatorJoin(b *testing.B) {
	for _, n := range []int{0, 50} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			st := scaleState(b, n)
			c, cur := loadedCalc(b, st)
			last := st.Endpoints[len(st.Endpoints)-1]
			key := datastore.EndpointKey(last.Node, last.ID)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				e := last
				e.Joined = i%2 == 1
				c.OnUpdate(key, e)
				want, _ := c.CompleteDeferredWork()
				if ops := Diff(cur, want); len(ops) == 0 && i%2 == 0 {
					b.Fatal("no change")
				}
			}
		})
	}
}

// BenchmarkCalculatorPolicyUpdate: with 1000 local endpoints and 50
// policies selecting them, one policy's rule changes (its port, in turn)
// and the tables are computed and diffed: the host's part of a policy
// update reaching the kernel.
func BenchmarkCalculatorPolicyUpdate(b *testing.B) {
	st := scaleState(b, 50)
	c, cur := loadedCalc(b, st)
	p := st.Policies[len(st.Policies)/2]
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q := p
		q.Spec.Ingress = slices.Clone(p.Spec.Ingress)
		q.Spec.Ingress[0].Destination.Ports = []api.Port{{Min: uint16(2000 + i%2), Max: uint16(2000 + i%2)}}
		c.OnUpdate(api.PolicyKey(q.Metadata.Name), q)
		want, _ := c.CompleteDeferredWork()
		if ops := Diff(cur, want); len(ops) == 0 {
			b.Fatal("no change")
		}
	}
}

// loadedCalc is a Calculator that took st's records, and the tables as
// NFT remembers them after programming its result.
func loadedCalc(b *testing.B, st State) (*incrementalCalc, Ruleset) {
	c := newIncrementalCalc(st.Node, st.IPv6, st.Failsafe)
	for i, p := range st.Pools {
		c.OnUpdate(fmt.Sprintf("%s%d", ipam.PoolsPrefix, i), p)
	}
	for _, nw := range st.Networks {
		c.OnUpdate(datastore.NetworkKey(nw.ID), nw)
	}
	for _, nd := range st.Nodes {
		c.OnUpdate(datastore.NodesPrefix+nd.Name, nd)
	}
	for _, p := range st.Policies {
		c.OnUpdate(api.PolicyKey(p.Metadata.Name), p)
	}
	for _, e := range st.Endpoints {
		c.OnUpdate(datastore.EndpointKey(e.Node, e.ID), e)
	}
	rs, _ := c.CompleteDeferredWork()
	return c, programmed(b, rs)
}

// BenchmarkSyncerPass is the policy part of a Join as the syncer does it:
// one endpoint record joins (then leaves, in turn) through the intake and
// a pass computes the tables, at 10 and 1000 local endpoints, without and
// with 50 policies: mode=full the whole state decoded from the records
// and Desired (before the Calculator), mode=calc the Calculator. The Diff
// against the programmed tables (NFT's part) is left out: both modes hand
// it the same Ruleset.
func BenchmarkSyncerPass(b *testing.B) {
	for _, mode := range []string{"full", "calc"} {
		for _, policies := range []int{0, 50} {
			for _, n := range []int{10, 1000} {
				b.Run(fmt.Sprintf("mode=%s/policies=%d/endpoints=%d", mode, policies, n), func(b *testing.B) {
					st := scaleState(b, policies)
					st.Endpoints = st.Endpoints[:n]
					s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: st.Node, Dataplane: &fakeDataplane{}})
					if err != nil {
						b.Fatal(err)
					}
					ss := &syncState{records: map[string]map[string][]byte{}, loaded: map[string]bool{}, warned: map[string]bool{}}
					snap := func(prefix string, kvs map[string][]byte) {
						ss.merge(s, update{prefix: prefix, snapshot: kvs, rev: 1})
					}
					eps := map[string][]byte{}
					for _, e := range st.Endpoints {
						eps[datastore.EndpointKey(e.Node, e.ID)] = datastore.MustJSON(e)
					}
					nets := map[string][]byte{}
					for _, nw := range st.Networks {
						nets[datastore.NetworkKey(nw.ID)] = datastore.MustJSON(nw)
					}
					pols := map[string][]byte{}
					for _, p := range st.Policies {
						pols[api.PolicyKey(p.Metadata.Name)] = datastore.MustJSON(p)
					}
					snap(datastore.EndpointsPrefix, eps)
					snap(datastore.NetworksPrefix, nets)
					snap(api.PoliciesPrefix, pols)
					last := st.Endpoints[n-1]
					key := datastore.EndpointKey(last.Node, last.ID)
					b.ResetTimer()
					cpu0 := processCPU(b)
					defer func() { b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op") }()
					for i := 0; i < b.N; i++ {
						e := last
						e.Joined = i%2 == 1
						ss.merge(s, update{prefix: datastore.EndpointsPrefix, event: &datastore.Event{Type: datastore.EventPut, Key: key, Value: datastore.MustJSON(e), ModRevision: int64(i + 2)}})
						if mode == "full" {
							st, _ := s.state(ss.records)
							Desired(st)
						} else {
							ss.calculator(s).CompleteDeferredWork()
						}
					}
				})
			}
		}
	}
}

// processCPU is the CPU time the process used so far (ns): on a loaded
// machine it tells the work apart from the waiting for a core.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
