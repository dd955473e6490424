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
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// BenchmarkMultiHostPolicyUpdate: a policy change written to the datastore
// (as `calico-cnm apply` does) until host b's kernel enforces it (its
// policy chain has the new rule count); 20 trials, p50/p99. Host b runs a
// container the policy selects, so the chain exists there.
func BenchmarkMultiHostPolicyUpdate(b *testing.B) {
	c, _, hb := newBenchCluster(b)
	ctx := context.Background()
	store := c.openStore(b)
	hb.MustDocker(b, "run", "-d", "--name", "sel", "--net", mhNetwork, "--label", policy.LabelPrefix+"role=backend", harness.Image, "sleep", "3600")
	chain := policy.PolicyChainName("bench", api.Ingress)
	rules := func() int {
		out, err := hb.Exec(b, "nft", "list", "chain", "ip", policy.TableName, chain)
		if err != nil {
			return -1
		}
		return strings.Count(out, "comment \"bench ingress rule")
	}
	write := func(n int) {
		spec := "spec:\n  selector: role == 'backend'\n  types: [Ingress]\n  ingress:\n"
		for i := 0; i < n; i++ {
			spec += fmt.Sprintf("  - action: Allow\n    protocol: TCP\n    destination: {ports: [%d]}\n", 1000+i)
		}
		ps, err := api.Decode(strings.NewReader("apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: bench}\n" + spec))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := api.Apply(ctx, store, ps); err != nil {
			b.Fatal(err)
		}
	}
	wait := func(n int) error {
		deadline := time.Now().Add(20 * time.Second)
		for rules() != n {
			if time.Now().After(deadline) {
				return fmt.Errorf("host b's chain never got %d rules", n)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}
	write(1)
	if err := wait(1); err != nil {
		b.Fatal(err)
	}
	const trials = 20
	for i := 0; i < b.N; i++ {
		var lat []time.Duration
		for trial := 0; trial < trials; trial++ {
			n := 2 + trial%2 // alternate 2 and 3 rules: every write is a change
			start := time.Now()
			write(n)
			if err := wait(n); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.Logf("policy written -> enforced on b, %d trials: p50 %s p99 %s max %s (the poll runs nft every 2ms: resolution ~10ms)", trials, p50, p99, slices.Max(lat))
	}
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
