package bench

import (
	"fmt"
	"image"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestGoalsPanel: every figure with a target is a row of the targets panel
// and table, whoever added it (the built-in ratios, a series with a Target,
// a benchmark's "-target" metric), in order, each judged in its direction;
// the PNG opens with that panel, green bars for the met, red for the
// missed.
func TestGoalsPanel(t *testing.T) {
	r := Results{
		RunCalico:     []time.Duration{110 * time.Millisecond, 120 * time.Millisecond},
		RunBridge:     []time.Duration{100 * time.Millisecond, 100 * time.Millisecond},
		RunUserBridge: []time.Duration{110 * time.Millisecond, 100 * time.Millisecond},
	}
	for i := range 100 {
		r.Joins = append(r.Joins, time.Duration(5+i/50)*time.Millisecond)
	}
	r.Add(Series{Plot: "IPAM vs 382a2b2", Name: "1 host", YLabel: "x", Y: []float64{1.3}, Kind: Bars, Target: 1, AtLeast: true})
	r.AddValue("no target", "plain", "ms", 5)
	bench := `BenchmarkMultiHostJoinWithPolicies-2   	1	1 ns/op	1.40 ratio	1.30 ratio-target
BenchmarkMultiHostPolicyUpdate-2   	1	1 ns/op	16.1 p50-ms	50 p50-target-ms	27.9 p99-ms
`
	if err := r.AddBenchOutput(strings.NewReader(bench), "bench.txt"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range r.Goals() {
		got = append(got, g.Name+" "+verdictWord(g))
	}
	want := []string{
		"docker run: calico / user-defined bridge met",
		"docker run: calico / default bridge missed",
		"Join: endpoint 100 / endpoint 10 met",
		"IPAM vs 382a2b2: 1 host met",
		"MultiHostJoinWithPolicies (ratio): ratio missed",
		"MultiHostPolicyUpdate (ms): p50 met",
	}
	requireLines(t, "goals", got, want)
	requireMarkdown(t, r,
		"## Targets",
		"| docker run: calico / default bridge | 1.15x | <= 1.10x | **misses** |",
		"| IPAM vs 382a2b2: 1 host | 1.30x | >= 1.00x | meets |",
		"| MultiHostPolicyUpdate (ms): p50 | 16.1 ms | <= 50 ms | meets |",
	)
	m := renderPNG(t, r)
	// The panel is the top band: its green and red bars are there, above
	// the first row of plots.
	plots := len(plotGroups(r.Series()))
	rowsH := (plots + plotCols - 1) / plotCols * 384
	band := m.(interface {
		SubImage(image.Rectangle) image.Image
	}).SubImage(image.Rect(0, 0, m.Bounds().Dx(), m.Bounds().Dy()-rowsH))
	if band.Bounds().Dy() < 384 {
		t.Fatalf("no targets band above the %d plots: image %v", plots, m.Bounds().Size())
	}
	if n := countColor(band, goalMet); n < 200 {
		t.Errorf("only %d pixels of met (green) bars in the targets band", n)
	}
	if n := countColor(band, goalMissed); n < 200 {
		t.Errorf("only %d pixels of missed (red) bars in the targets band", n)
	}
}

// TestOwnedBlocksRow: the owned-blocks benchmark's output becomes a line of
// allocations per assignment and a targets row of the 100 / 1 ratio.
func TestOwnedBlocksRow(t *testing.T) {
	out := `BenchmarkAutoAssignOwnedBlocks/blocks=1-2         	     300	   5653176 ns/op	       176.9 assign/s	         1.000 roundtrips/op	  108218 B/op	     789 allocs/op
BenchmarkAutoAssignOwnedBlocks/blocks=20-2        	     300	   1353819 ns/op	       738.7 assign/s	         1.000 roundtrips/op	  105637 B/op	     781 allocs/op
BenchmarkAutoAssignOwnedBlocks/blocks=100-2       	     300	   2670177 ns/op	       374.5 assign/s	         1.000 roundtrips/op	  233725 B/op	    7528 allocs/op
`
	var r Results
	if err := addOwnedBlocks(&r, strings.NewReader(out)); err != nil {
		t.Fatal(err)
	}
	goals := r.Goals()
	if len(goals) != 1 || goals[0].Met() || goals[0].Value < 9.5 || goals[0].Value > 9.6 {
		t.Fatalf("goals = %+v, want one missed row of 7528/789", goals)
	}
	if err := addOwnedBlocks(&r, strings.NewReader("PASS\n")); err == nil {
		t.Error("output without the benchmark's lines read as fine")
	}
}

// TestIdleRows: the idle figures become a Range row with a target of 0, a
// CPU row against 1% and a warnings row against 0, each judged; the other
// methods are figures without a target; a missed target of 0 draws past
// the target line and a met one draws nothing.
func TestIdleRows(t *testing.T) {
	var r Results
	addIdle(&r, harness.IdleFigures{Window: 30 * time.Second,
		Requests: map[string]float64{"Range": 2, "Txn": 1, "LeaseKeepAlive": 10}, CPU: 150 * time.Millisecond})
	var got []string
	for _, g := range r.Goals() {
		got = append(got, fmt.Sprintf("%s %s %.2f", g.Name, verdictWord(g), g.share()))
	}
	want := []string{
		PlotIdle + ": Range requests missed 1.50",
		PlotIdle + " (CPU): daemon CPU met 0.50",
		PlotIdle + " (log): warning lines met 0.00",
	}
	requireLines(t, "goals", got, want)
	requireMarkdown(t, r,
		"| "+PlotIdle+": Range requests | 4 /min | <= 0 /min | **misses** |",
		"| "+PlotIdle+" | LeaseKeepAlive requests | 1 | 20 /min |",
	)
}

// TestJoinRatioByProbes: a pass that took probes is judged by them, not
// by the windows of its own endpoints, and the report says both.
func TestJoinRatioByProbes(t *testing.T) {
	var r Results
	for i := range 1000 {
		// The last 10 endpoints' window reads 1.5x the first's.
		r.Joins = append(r.Joins, time.Duration(10+5*(i/990))*time.Millisecond)
		r.JoinsWithPolicies = append(r.JoinsWithPolicies, 10*time.Millisecond)
	}
	for i := range JoinProbeCount {
		r.JoinProbes.At10 = append(r.JoinProbes.At10, time.Duration(20+i%3)*time.Millisecond)     // median 21 ms
		r.JoinProbes.AtFull = append(r.JoinProbes.AtFull, time.Duration(22+i%3)*time.Millisecond) // median 23 ms
		r.JoinProbesWithPolicies.At10 = append(r.JoinProbesWithPolicies.At10, 10*time.Millisecond)
		r.JoinProbesWithPolicies.AtFull = append(r.JoinProbesWithPolicies.AtFull, 14*time.Millisecond)
	}
	var got []string
	for _, g := range r.Goals() {
		if strings.HasPrefix(g.Name, "Join") {
			got = append(got, fmt.Sprintf("%s %s %.3g", g.Name, verdictWord(g), g.Value))
		}
	}
	want := []string{
		"Join: at 1000 endpoints / at 10 met 1.1",
		"Join with 50 policies: at 1000 endpoints / at 10 missed 1.4",
	}
	requireLines(t, "goals", got, want)
	requireMarkdown(t, r,
		"Join of a probe endpoint on a host with 1000 endpoints vs on a host with 10, in turns (medians of 50 and 50 probes): 23.0 ms vs 21.0 ms, 1.10x: meets the target (<= 1.20x).",
		"The same pass by its own endpoints: endpoint 1000 vs endpoint 10 (medians of 10): 1.50x; medians of 50: first 50 10.0 ms, last 50 10.0 ms, 1.00x.",
		"With 50 policies selecting every endpoint (the host filled again from empty): Join of a probe endpoint on a host with 1000 endpoints vs on a host with 10, in turns (medians of 50 and 50 probes): 14.0 ms vs 10.0 ms, 1.40x: **misses the target** (<= 1.30x).",
		"| Join: at 1000 endpoints / at 10 | 1.10x | <= 1.20x | meets |",
	)
}

// TestIssue20Rows: the rows of issue 20 each become a row of the targets
// panel, judged in their direction: the Join ratio without and with
// policies (against 1.2x and 1.3x), the RSS with the host full (64 MiB),
// the policy update's p50 (50 ms; its p99 has no target), the start to
// serving (2 s) and the BGP scale rows of the file BenchmarkBGPScale
// writes (2 s, and 2x gobgpd for the mesh).
func TestIssue20Rows(t *testing.T) {
	r := Results{RSSIdleKiB: 40 * 1024, RSSLoadedKiB: 90 * 1024}
	for i := range 1000 {
		// 10 ms, then 11 ms from endpoint 500 on: 1.1x.
		r.Joins = append(r.Joins, time.Duration(10+i/500)*time.Millisecond)
		// 10 ms, then 15 ms: 1.5x.
		r.JoinsWithPolicies = append(r.JoinsWithPolicies, time.Duration(10+5*(i/500))*time.Millisecond)
	}
	var lat []time.Duration
	for i := range 20 {
		lat = append(lat, time.Duration(20+i)*time.Millisecond) // p50 29 ms, p99 39 ms
	}
	addPolicyUpdate(&r, lat)
	addStart(&r, startTimes{answering: 2 * time.Second, serving: 2500 * time.Millisecond})
	scale := "BenchmarkBGPScale32HostsMesh\t1\t356000000 ns/op\t0.3560 routes-s\t2 routes-target-s\t0.1110 claims-s\t1.2400 vs-gobgpd-x\t2 vs-gobgpd-target-x\n" +
		"BenchmarkBGPScale64Hosts2Reflectors\t1\t2647000000 ns/op\t2.6470 routes-s\t2 routes-target-s\t0.7480 claims-s\n"
	if err := r.AddBenchOutput(strings.NewReader(scale), "scale.txt"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range r.Goals() {
		got = append(got, fmt.Sprintf("%s %s %.3g", g.Name, verdictWord(g), g.Value))
	}
	want := []string{
		"Join: endpoint 1000 / endpoint 10 met 1.1",
		"Join with 50 policies: endpoint 1000 / endpoint 10 missed 1.5",
		"daemon memory (VmRSS): 1000 endpoints missed 90",
		PlotPolicyUpdate + ": p50 met 29",
		PlotStart + ": exec to /healthz ok missed 2.5",
		"BGPScale32HostsMesh (s): routes met 0.356",
		"BGPScale32HostsMesh (x): vs-gobgpd met 1.24",
		"BGPScale64Hosts2Reflectors (s): routes missed 2.65",
	}
	requireLines(t, "goals", got, want)
	requireMarkdown(t, r,
		"| Join with 50 policies: endpoint 1000 / endpoint 10 | 1.50x | <= 1.30x | **misses** |",
		"| Join: endpoint 1000 / endpoint 10 | 1.10x | <= 1.20x | meets |",
		"| daemon memory (VmRSS): 1000 endpoints | 90 MiB | <= 64 MiB | **misses** |",
		"| "+PlotPolicyUpdate+": p50 | 29 ms | <= 50 ms | meets |",
		"| "+PlotStart+": exec to /healthz ok | 2.5 s | <= 2 s | **misses** |",
		"| BGPScale32HostsMesh (s): routes | 0.356 s | <= 2 s | meets |",
		"| 1000 | 11.0 ms | 15.0 ms |",
		"With 50 policies selecting every endpoint (the host filled again from empty): endpoint 1000 vs endpoint 10 (medians of 10): 1.50x: **misses the target** (<= 1.30x); medians of 50: first 50 10.0 ms, last 50 15.0 ms, 1.50x.",
		"| "+PlotPolicyUpdate+" | p99 | 1 | 39 ms |",
	)
	// Every row is drawn: the panel grows with the rows.
	if n := countColor(renderPNG(t, r), goalMissed); n < 4*200 {
		t.Errorf("only %d pixels of missed (red) bars for four missed rows", n)
	}
	// A figure 100 times its target does not squeeze the other bars.
	gp, err := goalsPlot(append(r.Goals(), Goal{Name: "far off", Value: 100, Target: 1, Unit: "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if gp.X.Max > goalShareMax*1.1 {
		t.Errorf("the panel's axis runs to %.1f, past the longest bar %.1f", gp.X.Max, goalShareMax)
	}
}

// verdictWord is how these tests write whether a goal was met.
func verdictWord(g Goal) string {
	if g.Met() {
		return "met"
	}
	return "missed"
}

// requireLines fails unless got and want are the same lines.
func requireLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
