package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/policy/selector"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// BenchmarkMultiHostPolicyUpdate: a policy change written to the datastore
// (as `calico-cnm apply` does) until host b's kernel enforces it (its
// policy chain has the new rule count); 20 trials, p50/p99. Host b runs a
// container the policy selects, so the chain exists there.
func BenchmarkMultiHostPolicyUpdate(b *testing.B) {
	c, _, hb := newBenchCluster(b)
	u := newPolicyUpdater(b, c, hb, "")
	for i := 0; i < b.N; i++ {
		lat := u.trials(b, 20)
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.Logf("policy written -> enforced on b, %d trials: p50 %s p99 %s max %s (the poll runs nft every 2ms: resolution ~10ms)", len(lat), p50, p99, slices.Max(lat))
	}
}

// BenchmarkMultiHostPolicyUpdateNetworkSet: BenchmarkMultiHostPolicyUpdate
// with every rule of the policy matching a GlobalNetworkSet of 10,000
// networks by selector, against the same policy without the set in the
// same run (the ratio is the figure); and the set itself changed (one
// network added or removed) until host b's kernel set has the change.
func BenchmarkMultiHostPolicyUpdateNetworkSet(b *testing.B) {
	c, _, hb := newBenchCluster(b)
	ctx := context.Background()
	plain := newPolicyUpdater(b, c, hb, "")
	var nets []string
	for i := 0; i < 10000; i++ {
		nets = append(nets, fmt.Sprintf("10.%d.%d.0/25", 100+i/128, (i%128)*2))
	}
	gns := api.GlobalNetworkSet{APIVersion: api.APIVersion, Kind: api.KindNetworkSet,
		Metadata: api.Metadata{Name: "big", Labels: map[string]string{"list": "big"}}, Spec: api.NetworkSetSpec{Nets: nets}}
	if _, err := api.ApplyResources(ctx, plain.store, api.Resources{NetworkSets: []api.GlobalNetworkSet{gns}}); err != nil {
		b.Fatal(err)
	}
	withSet := newPolicyUpdater(b, c, hb, "source: {selector: \"list == 'big'\"}, ")
	set := policy.RuleSelectorSetName(selector.MustParse("list == 'big'"), false)
	// `nft get element` looks one address up: listing 10,000 elements at
	// every poll would load the machine it measures.
	inSet := func(addr string, want bool) error {
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := hb.Exec(b, "nft", "get", "element", "ip", policy.TableName, set, "{ "+addr+" }")
			if (err == nil) == want {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("host b's set %s never had %s = %v", set, addr, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i := 0; i < b.N; i++ {
		const trials = 20
		var without, with, setLat []time.Duration
		for t := 0; t < trials/5; t++ { // interleaved: the machine is shared
			without = append(without, plain.trials(b, 5)...)
			with = append(with, withSet.trials(b, 5)...)
		}
		for t := 0; t < trials; t++ {
			add := t%2 == 0
			s := gns
			s.Spec.Nets = slices.Clone(nets)
			if add {
				s.Spec.Nets = append(s.Spec.Nets, "172.16.9.0/24")
			}
			start := time.Now()
			if _, err := api.ApplyResources(ctx, plain.store, api.Resources{NetworkSets: []api.GlobalNetworkSet{s}}); err != nil {
				b.Fatal(err)
			}
			if err := inSet("172.16.9.1", add); err != nil {
				b.Fatal(err)
			}
			setLat = append(setLat, time.Since(start))
		}
		p50w, p50, p50s := percentile(without, 50), percentile(with, 50), percentile(setLat, 50)
		b.ReportMetric(float64(p50w.Microseconds())/1000, "without-ms")
		b.ReportMetric(float64(p50.Microseconds())/1000, "with10kset-ms")
		b.ReportMetric(float64(p50s.Microseconds())/1000, "setupdate-ms")
		b.ReportMetric(float64(p50)/float64(p50w), "ratio")
		b.Logf("policy written -> enforced on b, p50 of %d: without a set %s, with a 10,000-network set %s (%.2fx); the set changed -> in b's kernel p50 %s (poll every 5ms)",
			trials, p50w, p50, float64(p50)/float64(p50w), p50s)
	}
}

// policyUpdater writes policy "bench<n>" selecting host b's container
// and waits for b's kernel to have it; rule is put in each of its rules.
type policyUpdater struct {
	name, rule string
	store      *datastore.Store
	hb         *bgpHost
	n          int // rules now: 2 and 3 alternate, every write is a change
}

func newPolicyUpdater(b *testing.B, c *bgpCluster, hb *bgpHost, rule string) *policyUpdater {
	b.Helper()
	u := &policyUpdater{name: "bench", rule: rule, store: c.openStore(b), hb: hb}
	if rule != "" {
		u.name = "bench-set"
	}
	if _, err := hb.Docker(b, "inspect", "sel"); err != nil {
		hb.MustDocker(b, "run", "-d", "--name", "sel", "--net", mhNetwork, "--label", policy.LabelPrefix+"role=backend", harness.Image, "sleep", "3600")
	}
	u.write(b, 1)
	if err := u.wait(b, 1); err != nil {
		b.Fatal(err)
	}
	return u
}

func (u *policyUpdater) rules(b *testing.B) int {
	out, err := u.hb.Exec(b, "nft", "list", "chain", "ip", policy.TableName, policy.PolicyChainName(u.name, api.Ingress))
	if err != nil {
		return -1
	}
	return strings.Count(out, "comment \""+u.name+" ingress rule")
}

func (u *policyUpdater) write(b *testing.B, n int) {
	spec := "spec:\n  selector: role == 'backend'\n  types: [Ingress]\n  ingress:\n"
	for i := 0; i < n; i++ {
		spec += fmt.Sprintf("  - {action: Allow, protocol: TCP, %sdestination: {ports: [%d]}}\n", u.rule, 1000+i)
	}
	ps, err := api.Decode(strings.NewReader("apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: " + u.name + "}\n" + spec))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := api.Apply(context.Background(), u.store, ps); err != nil {
		b.Fatal(err)
	}
	u.n = n
}

func (u *policyUpdater) wait(b *testing.B, n int) error {
	deadline := time.Now().Add(20 * time.Second)
	for u.rules(b) != n {
		if time.Now().After(deadline) {
			return fmt.Errorf("host b's chain never got %d rules", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// trials times n policy changes, written -> enforced on b.
func (u *policyUpdater) trials(b *testing.B, n int) []time.Duration {
	var lat []time.Duration
	for t := 0; t < n; t++ {
		next := 2 + (u.n+1)%2
		start := time.Now()
		u.write(b, next)
		if err := u.wait(b, next); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return lat
}

// BenchmarkMultiHostJoinWithPolicies: `docker run -d` of a labelled
// container on host a with many local endpoints, without policies and
// then with 50 policies selecting every endpoint (each with three rules),
// then without again (the baseline is the mean of the two).
// The run includes the Join, which returns only once the container's rules
// are in the kernel. CALICO_CNM_BENCH_POLICY_ENDPOINTS sets the number of
// endpoints started first (default 100; the figure is 1000).
func BenchmarkMultiHostJoinWithPolicies(b *testing.B) {
	c, ha, _ := newBenchCluster(b)
	ctx := context.Background()
	store := c.openStore(b)
	endpoints := 100
	if v, err := strconv.Atoi(os.Getenv("CALICO_CNM_BENCH_POLICY_ENDPOINTS")); err == nil && v > 0 {
		endpoints = v
	}
	seq := 0
	run := func() time.Duration {
		seq++
		start := time.Now()
		ha.MustDocker(b, "run", "-d", "--name", fmt.Sprintf("j%d", seq), "--net", mhNetwork,
			"--label", fmt.Sprintf("%srole=r%d", policy.LabelPrefix, seq%10), harness.Image, "sleep", "3600")
		return time.Since(start)
	}
	for i := 0; i < endpoints; i++ {
		run()
	}
	const trials = 20
	measure := func() time.Duration {
		var lat []time.Duration
		for i := 0; i < trials; i++ {
			lat = append(lat, run())
		}
		return percentile(lat, 50)
	}
	for i := 0; i < b.N; i++ {
		without := measure()
		var ps []api.GlobalNetworkPolicy
		for p := 0; p < 50; p++ {
			doc := fmt.Sprintf("apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: j%d}\nspec:\n  order: %d\n  selector: has(role)\n  ingress:\n"+
				"  - {action: Allow, protocol: TCP, source: {selector: \"role == 'r%d'\"}, destination: {ports: [%d]}}\n  - {action: Log}\n  - {action: Pass, source: {nets: [10.%d.0.0/16]}}\n",
				p, p, p%10, 1000+p, p)
			got, err := api.Decode(strings.NewReader(doc))
			if err != nil {
				b.Fatal(err)
			}
			ps = append(ps, got...)
		}
		if _, err := api.Apply(ctx, store, ps); err != nil {
			b.Fatal(err)
		}
		with := measure()
		// Runs slow down as containers accumulate: measure without
		// policies again after, and compare with the mean of both.
		for _, p := range ps {
			if err := api.Delete(ctx, store, p.Metadata.Name); err != nil {
				b.Fatal(err)
			}
		}
		without = (without + measure()) / 2
		b.ReportMetric(float64(without.Microseconds())/1000, "without-ms")
		b.ReportMetric(float64(with.Microseconds())/1000, "with50policies-ms")
		b.ReportMetric(float64(with)/float64(without), "ratio")
		b.Logf("docker run -d at %d+ local endpoints, p50 of %d: without policies %s, with 50 selecting policies %s (%.2fx)",
			endpoints, trials, without, with, float64(with)/float64(without))
	}
}

// openStore is a datastore client of the cluster's etcd, closed when tb
// ends.
func (c *bgpCluster) openStore(tb testing.TB) *datastore.Store {
	tb.Helper()
	store, err := datastore.Open(context.Background(), datastore.Config{Endpoints: []string{c.etcd}}, logrus.New())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { store.Close() })
	return store
}
