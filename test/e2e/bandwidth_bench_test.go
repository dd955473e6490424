package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/bandwidth"
)

// BenchmarkMultiHostBandwidth (issue 22): what a bandwidth limit costs
// `docker run` (run until running and addressed, with ingress and egress
// limits vs without, interleaved on the same host, 15 each; target <= 1.05x)
// and how close the shaped rate comes to the limit at 10 mbit, 100 mbit and
// 1 gbit (median of 3 iperf3 runs to a container on another host, each
// direction; the error in %). Named MultiHost so that make bench runs it
// with the other multi-host benchmarks.
func BenchmarkMultiHostBandwidth(b *testing.B) {
	_, ha, hb := newBenchCluster(b)
	srvIP := bwServer(b, ha, hb)

	run := func(name string, limited bool) time.Duration {
		args := []string{"run", "-d", "--name", name, "--net", mhNetwork}
		if limited {
			args = append(args, bwLabelArgs("100mbit", "100mbit")...)
		} else {
			// As many labels, none about bandwidth: the ratio is the
			// shaping's, not that of learning two labels.
			args = append(args, "--label", "bench.ingress=100mbit", "--label", "bench.egress=100mbit")
		}
		start := time.Now()
		ha.MustDocker(b, append(args, bwImage, "sleep", "3600")...)
		tmpl := fmt.Sprintf(`{{.State.Running}} {{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
		out := ha.MustDocker(b, "inspect", "-f", tmpl, name)
		took := time.Since(start)
		if f := strings.Fields(out); len(f) != 2 || f[0] != "true" || f[1] == "" {
			b.Fatalf("%s is not running with an address: %q", name, out)
		}
		ha.MustDocker(b, "rm", "-f", name)
		return took
	}
	const runs, warmups = 15, 2
	rates := []uint64{10e6, 100e6, 1e9}
	for i := 0; i < b.N; i++ {
		for w := range warmups {
			run(fmt.Sprintf("warm-%d-%d", i, w), w%2 == 0)
		}
		var with, without []time.Duration
		for r := range runs {
			// Alternate which goes first, so drift hits both alike.
			first := r%2 == 0
			d1 := run(fmt.Sprintf("run-%d-%d-a", i, r), first)
			d2 := run(fmt.Sprintf("run-%d-%d-b", i, r), !first)
			if first {
				with, without = append(with, d1), append(without, d2)
			} else {
				with, without = append(with, d2), append(without, d1)
			}
		}
		mw, mo := percentile(with, 50), percentile(without, 50)
		// The median of each round's ratio as well: a round's two runs
		// share the machine's load of that moment.
		var paired []float64
		for r := range with {
			paired = append(paired, float64(with[r])/float64(without[r]))
		}
		slices.Sort(paired)
		b.ReportMetric(float64(mw.Microseconds())/1000, "limited-ms")
		b.ReportMetric(float64(mo.Microseconds())/1000, "unlimited-ms")
		b.ReportMetric(float64(mw)/float64(mo), "ratio")
		b.ReportMetric(paired[len(paired)/2], "paired-ratio")
		b.Logf("docker run, median of %d: with limits %s, without %s, ratio %.3f, median per-round ratio %.3f (target <= 1.05)", runs, mw, mo, float64(mw)/float64(mo), paired[len(paired)/2])

		for _, rate := range rates {
			name := "rate-" + bandwidth.FormatRate(rate)
			r := bandwidth.FormatRate(rate)
			ha.MustDocker(b, append(append([]string{"run", "-d", "--name", name, "--net", mhNetwork}, bwLabelArgs(r, r)...), bwImage, "sleep", "3600")...)
			var errs []string
			for _, dir := range []struct {
				name    string
				reverse bool
			}{{bandwidth.DirEgress, false}, {bandwidth.DirIngress, true}} {
				got := iperfMedian(b, ha, name, srvIP, dir.reverse)
				e := (got/float64(rate) - 1) * 100
				b.ReportMetric(e, fmt.Sprintf("%s-%s-err%%", dir.name, r))
				errs = append(errs, fmt.Sprintf("%s %.1f Mbit/s (%+.1f%%)", dir.name, got/1e6, e))
			}
			b.Logf("limit %s: %s", r, strings.Join(errs, ", "))
			ha.MustDocker(b, "rm", "-f", name)
		}
	}
}
