// Package bench measures calico-cnm side by side with Docker's own bridge
// driver and writes the figures as a markdown report with a PNG of plots
// (`make bench`; the measurement itself is TestBenchReport, which needs root
// and dockerd like the end-to-end tests).
//
// Adding a measurement to the report is one call on the Results that
// TestBenchReport fills:
//
//	res.AddDurations("published port: docker run -p", "calico", samples) // points, ms, run order
//	res.AddValue("VXLAN throughput", "container", "Gbit/s", 9.1)          // one bar
//	res.Add(bench.Series{Plot: "BGP scale", Name: "convergence", XLabel: "nodes",
//		YLabel: "ms", X: nodes, Y: ms, Kind: bench.Line, LogY: true})      // anything else
//
// A series with a Target (or a benchmark metric "<m>-target-<unit>" next to
// "<m>-<unit>", "ratio-target" next to "ratio") is also a row of the
// targets panel that opens the PNG and of the "Targets" table: its value
// against its target, nothing else to write.
//
// Series with the same Plot title share one plot (axes, legend); a new title
// is a new plot. Each added series also gets a row (median, min, max) under
// "Other figures" in report.md. Figures from `go test -bench` output (the
// multi-host benchmarks in test/e2e) come in with AddBenchOutput.
package bench

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/perf/benchfmt"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Results are the figures of one run.
type Results struct {
	When    time.Time
	Host    string // kernel, CPUs: what the figures were measured on
	Dockerd string // dockerd version

	// docker run -d until the container is running with its address, on a
	// calico network, on Docker's default bridge network and on a
	// user-defined bridge network of the same dockerd; run i of each series
	// belongs to the same round (the three back to back).
	RunCalico, RunBridge, RunUserBridge []time.Duration

	// IPAM engine micro-benchmark (BenchmarkAutoAssign, one host).
	AssignPerSec       float64
	RoundTripsPerAssgn float64
	TxnsPerAssign      float64
	ReadsPerAssign     float64
	// Same with three hosts assigning at once.
	AssignPerSec3Hosts float64

	// Join latency of the i-th endpoint (index 0 = first) while the host
	// fills up with endpoints.
	Joins []time.Duration
	// JoinsWithPolicies: the same, filled again from empty with
	// JoinPolicies policies selecting every endpoint.
	JoinsWithPolicies []time.Duration
	// JoinProbes and JoinProbesWithPolicies are each pass's Joins at 10
	// endpoints and with the host full, taken with a probe (joinProbe):
	// the ratio the targets judge.
	JoinProbes, JoinProbesWithPolicies JoinProbes

	// Daemon resident memory, idle and with len(Joins) endpoints.
	RSSIdleKiB, RSSLoadedKiB int64

	// Extra are the series other benchmarks add (Add, AddDurations,
	// AddValue): BGP convergence, throughput, and whatever comes next.
	Extra []Series
}

// Percentile is the nearest-rank percentile p (0-100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Median of ds.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// JoinWindow is the median Join latency of the endpoints numbered
// (1-based) from-to.
func (r Results) JoinWindow(from, to int) time.Duration { return joinWindow(r.Joins, from, to) }

func joinWindow(joins []time.Duration, from, to int) time.Duration {
	from, to = max(from, 1), min(to, len(joins))
	if from > to {
		return 0
	}
	return Median(joins[from-1 : to])
}

// lastToTenth is the median of the last 10 Joins over that of the first
// 10: the Join ratio of a pass without probes.
func lastToTenth(joins []time.Duration) float64 {
	return ratio(joinWindow(joins, len(joins)-9, len(joins)), joinWindow(joins, 1, 10))
}

// JoinProbes are Joins of one probe endpoint after another (each removed
// before the next joins): AtFull on the host filled up, At10 on a second
// host holding 10 endpoints, in turns. A window of 10 consecutive
// endpoints' Joins moves by a fifth either way on this machine even when
// the Join cost is flat, and a busy spell of the machine lands on
// whichever size is being measured then: JoinProbeCount probes of each,
// taken in turns over the same minute, measure the Join at each size.
type JoinProbes struct{ At10, AtFull []time.Duration }

// JoinProbeCount is how many probes measure the Join at each point.
const JoinProbeCount = 50

func (p JoinProbes) ok() bool { return len(p.At10) > 0 && len(p.AtFull) > 0 }

func (p JoinProbes) ratio() float64 { return ratio(Median(p.AtFull), Median(p.At10)) }

// joinGoalName names a pass's Join row by what its ratio compares.
func joinGoalName(what string, n int, probes JoinProbes) string {
	if probes.ok() {
		return fmt.Sprintf("%s: at %d endpoints / at 10", what, n)
	}
	return fmt.Sprintf("%s: endpoint %d / endpoint 10", what, n)
}

// joinRatio is the Join ratio the targets judge: the probes' when the pass
// took them, else the windows of its first and last 10 endpoints.
func joinRatio(joins []time.Duration, probes JoinProbes) float64 {
	if probes.ok() {
		return probes.ratio()
	}
	return lastToTenth(joins)
}

// PairedRatio is the median of a[i]/b[i]: runs of the same round share the
// machine's momentary load, so this is steadier than the ratio of medians.
func PairedRatio(a, b []time.Duration) float64 {
	n := min(len(a), len(b))
	if n == 0 {
		return math.NaN()
	}
	rs := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		rs = append(rs, ratio(a[i], b[i]))
	}
	slices.Sort(rs)
	if n%2 == 1 {
		return rs[n/2]
	}
	return (rs[n/2-1] + rs[n/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// verdict words a measured ratio against its target (lower is better).
func verdict(r, target float64) string {
	if math.IsNaN(r) {
		return "n/a"
	}
	if r <= target {
		return fmt.Sprintf("meets the target (<= %.2fx)", target)
	}
	return fmt.Sprintf("**misses the target** (<= %.2fx)", target)
}

// JoinCheckpoints are the endpoint counts the report tabulates.
var JoinCheckpoints = []int{10, 100, 250, 500, 750, 1000}

// WriteMarkdown writes the report; png is the plot's file name next to it.
func (r Results) WriteMarkdown(w io.Writer, pngName string) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("# calico-cnm benchmark report")
	p("")
	p("Measured %s on %s, dockerd %s, by `make bench` (bench/bench_test.go). Ratios, not absolute times, are the point: the machine is shared.", r.When.UTC().Format(time.RFC3339), r.Host, r.Dockerd)
	p("")
	p("![plot](%s)", pngName)
	p("")
	p("## `docker run` until running and addressed (same dockerd, interleaved)")
	p("")
	cm, bm, um := Median(r.RunCalico), Median(r.RunBridge), Median(r.RunUserBridge)
	c99, b99, u99 := Percentile(r.RunCalico, 99), Percentile(r.RunBridge, 99), Percentile(r.RunUserBridge, 99)
	p("| network | runs | median | p99 |")
	p("|---|---|---|---|")
	p("| calico (`--driver calico --ipam-driver calico-ipam`) | %d | %s | %s |", len(r.RunCalico), ms(cm), ms(c99))
	p("| Docker bridge, user-defined (`docker network create -d bridge`) | %d | %s | %s |", len(r.RunUserBridge), ms(um), ms(u99))
	p("| Docker bridge, default `bridge` | %d | %s | %s |", len(r.RunBridge), ms(bm), ms(b99))
	p("| ratio calico / user-defined bridge | | %.2fx | %.2fx |", ratio(cm, um), ratio(c99, u99))
	p("| ratio calico / default bridge | | %.2fx | %.2fx |", ratio(cm, bm), ratio(c99, b99))
	p("")
	p("A calico network is a user-defined network, so Docker does the same extra work for it as for a user-defined bridge (embedded DNS resolver in the container, network-scoped aliases); the default `bridge` network skips that. Against the user-defined bridge: median ratio %.2fx, %s; median of the per-round ratios %.2fx. Against the default bridge: median ratio %.2fx, %s; per-round %.2fx.",
		ratio(cm, um), verdict(ratio(cm, um), TargetRunRatio), PairedRatio(r.RunCalico, r.RunUserBridge),
		ratio(cm, bm), verdict(ratio(cm, bm), TargetRunRatio), PairedRatio(r.RunCalico, r.RunBridge))
	p("")
	p("## IPAM (ipam.BenchmarkAutoAssign, embedded etcd)")
	p("")
	p("| figure | value |")
	p("|---|---|")
	p("| assignments per second, 1 host | %.0f /s |", r.AssignPerSec)
	p("| assignments per second, 3 hosts at once | %.0f /s |", r.AssignPerSec3Hosts)
	p("| etcd round trips per assignment | %.3f (%.3f txns + %.3f reads) |", r.RoundTripsPerAssgn, r.TxnsPerAssign, r.ReadsPerAssign)
	p("")
	p("## Join latency as the host fills up (CreateEndpoint + Join through the plugin socket, real veths)")
	p("")
	withPolicies := len(r.JoinsWithPolicies) > 0
	if withPolicies {
		p("| endpoints on the host | median Join latency of the last 10 | the same with %d selecting policies |", JoinPolicies)
		p("|---|---|---|")
	} else {
		p("| endpoints on the host | median Join latency of the last 10 |")
		p("|---|---|")
	}
	for _, n := range JoinCheckpoints {
		if n > len(r.Joins) {
			continue
		}
		if withPolicies && n <= len(r.JoinsWithPolicies) {
			p("| %d | %s | %s |", n, ms(r.JoinWindow(n-9, n)), ms(joinWindow(r.JoinsWithPolicies, n-9, n)))
		} else {
			p("| %d | %s |", n, ms(r.JoinWindow(n-9, n)))
		}
	}
	p("")
	r.markdownJoinRatio(p, "", r.Joins, r.JoinProbes, TargetJoinRatio)
	if withPolicies {
		r.markdownJoinRatio(p, fmt.Sprintf("With %d policies selecting every endpoint (the host filled again from empty): ", JoinPolicies), r.JoinsWithPolicies, r.JoinProbesWithPolicies, TargetJoinPoliciesRatio)
	}
	p("")
	p("## Daemon memory (VmRSS)")
	p("")
	p("| state | RSS |")
	p("|---|---|")
	p("| idle (after start, no endpoints) | %.1f MiB |", float64(r.RSSIdleKiB)/1024)
	p("| with %d endpoints | %.1f MiB |", len(r.Joins), float64(r.RSSLoadedKiB)/1024)
	p("")
	r.markdownGoals(p)
	r.markdownPlots(p)
	_, err := io.WriteString(w, b.String())
	return err
}

// markdownJoinRatio states one pass's Join ratio: by its probes when it
// took them (the figure judged), and by windows of its own endpoints.
func (r Results) markdownJoinRatio(p func(format string, a ...any), lead string, joins []time.Duration, probes JoinProbes, target float64) {
	n := len(joins)
	if probes.ok() {
		p("%sJoin of a probe endpoint on a host with %d endpoints vs on a host with 10, in turns (medians of %d and %d probes): %s vs %s, %.2fx: %s.", lead, n,
			len(probes.AtFull), len(probes.At10), ms(Median(probes.AtFull)), ms(Median(probes.At10)), probes.ratio(), verdict(probes.ratio(), target))
		lead = "The same pass by its own endpoints: "
	}
	endpoint := "endpoint"
	if lead == "" {
		endpoint = "Endpoint" // the sentence starts here
	}
	line := fmt.Sprintf("%s%s %d vs endpoint 10 (medians of 10): %.2fx", lead, endpoint, n, lastToTenth(joins))
	if !probes.ok() {
		line += ": " + verdict(lastToTenth(joins), target)
	}
	if n >= 100 {
		f50, l50 := joinWindow(joins, 1, 50), joinWindow(joins, n-49, n)
		line += fmt.Sprintf("; medians of 50: first 50 %s, last 50 %s, %.2fx", ms(f50), ms(l50), ratio(l50, f50))
	}
	p("%s.", line)
}

// markdownGoals tabulates Goals, as the first panel of the PNG draws them.
func (r Results) markdownGoals(p func(format string, a ...any)) {
	goals := r.Goals()
	if len(goals) == 0 {
		return
	}
	p("## Targets")
	p("")
	p("| figure | value | target | |")
	p("|---|---|---|---|")
	for _, g := range goals {
		p("| %s | %s | %s %s | %s |", g.Name, goalFigure(g.Value, g.Unit), g.bound(), goalFigure(g.Target, g.Unit), map[bool]string{true: "meets", false: "**misses**"}[g.Met()])
	}
	p("")
}

func (g Goal) bound() string {
	if g.AtLeast {
		return ">="
	}
	return "<="
}

func goalFigure(v float64, unit string) string {
	if unit == "x" {
		return fmt.Sprintf("%.2fx", v)
	}
	return figure(v, unit)
}

// markdownPlots writes the added series' figures and names the plots.
func (r Results) markdownPlots(p func(format string, a ...any)) {
	if len(r.Extra) > 0 {
		p("## Other figures")
		p("")
		p("| plot | series | values | median | min | max |")
		p("|---|---|---|---|---|---|")
		for _, s := range r.Extra {
			if len(s.Y) == 0 {
				continue
			}
			p("| %s | %s | %d | %s | %s | %s |", s.Plot, s.Name, len(s.Y), figure(medianOf(s.Y), s.YLabel), figure(slices.Min(s.Y), s.YLabel), figure(slices.Max(s.Y), s.YLabel))
		}
		p("")
	}
	p("## The plots")
	p("")
	var titles []string
	for _, g := range plotGroups(r.Series()) {
		titles = append(titles, g[0].Plot)
	}
	p("In order, two per row: %s. `docker run`: every run in run order, the lines are the medians; Join: each endpoint's latency against the number of endpoints on the host, with the median of each 50.", strings.Join(titles, "; "))
}

func figure(v float64, unit string) string { return strings.TrimSpace(fmt.Sprintf("%.4g %s", v, unit)) }

func medianOf(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ---------------------------------------------------------------- plots

// Kind is how a series is drawn.
type Kind int

const (
	Points Kind = iota // a marker per value
	Line               // the values joined in X order
	Bars               // a bar per value: for single figures (rates, throughput)
)

// Series is one set of figures, drawn in the plot its Plot names.
type Series struct {
	// Plot is the title of the plot the series is drawn in: series with
	// the same Plot share its axes and legend. Plots come in the order
	// their first series was added.
	Plot           string
	Name           string // legend entry; for Bars the bar's label
	XLabel, YLabel string // axis labels (the first series of a plot sets them)
	X              []float64
	Y              []float64 // X nil: Y in run order, X = 1..len(Y)
	Kind           Kind
	// Median adds, for Points, a horizontal line at the median in the
	// series' colour.
	Median bool
	// LogY makes the plot's Y axis logarithmic (when any of its series
	// asks); values <= 0 are then left out. Bars are always linear.
	LogY bool
	// Target, when set, is the goal of the series' figure (its median):
	// the series is then also a row of the targets panel (Goals). The
	// figure must stay at or under it, or reach it with AtLeast.
	Target  float64
	AtLeast bool
	// ZeroTarget makes 0 the target (a Target of 0 means none): the
	// figure must stay at 0, as idle datastore reads must.
	ZeroTarget bool
}

// Goal is one figure against its target: a row of the targets panel that
// opens report.png and of the "Targets" table.
type Goal struct {
	Name    string
	Value   float64
	Target  float64
	Unit    string // "x" for ratios
	AtLeast bool   // the value must reach Target; else stay at or under it
}

// zeroMissShare is the bar of a missed target of 0, which has no value /
// target: past the target line by as much as a figure at 1.5x its target.
const zeroMissShare = 1.5

// share is the bar's length in the targets panel: value / target; for a
// target of 0, nothing when met and zeroMissShare when not.
func (g Goal) share() float64 {
	if g.Target != 0 {
		return g.Value / g.Target
	}
	if g.Met() {
		return 0
	}
	return zeroMissShare
}

// Met tells whether the value meets its target.
func (g Goal) Met() bool {
	if g.AtLeast {
		return g.Value >= g.Target
	}
	return g.Value <= g.Target
}

// Targets of the built-in figures (lower is better).
const (
	TargetRunRatio  = 1.10 // docker run on calico / on a bridge
	TargetJoinRatio = 1.2  // Join of the last endpoint / of the 10th
	// TargetJoinPoliciesRatio is TargetJoinRatio with JoinPolicies
	// policies selecting every endpoint.
	TargetJoinPoliciesRatio = 1.3
	// TargetRSSMiB is the daemon's most RSS with the host full of
	// endpoints.
	TargetRSSMiB = 64
)

// JoinPolicies is how many policies select every endpoint in the second
// Join pass.
const JoinPolicies = 50

// Goals are every figure of the report that has a target: the built-in
// ratios, then every series with a Target, in the order they were added.
// A figure that was not measured (NaN) is left out.
func (r Results) Goals() []Goal {
	var out []Goal
	add := func(g Goal) {
		if !math.IsNaN(g.Value) && !math.IsInf(g.Value, 0) && g.Target >= 0 {
			out = append(out, g)
		}
	}
	cm, bm, um := Median(r.RunCalico), Median(r.RunBridge), Median(r.RunUserBridge)
	add(Goal{Name: "docker run: calico / user-defined bridge", Value: ratio(cm, um), Target: TargetRunRatio, Unit: "x"})
	add(Goal{Name: "docker run: calico / default bridge", Value: ratio(cm, bm), Target: TargetRunRatio, Unit: "x"})
	if len(r.Joins) >= 20 {
		add(Goal{Name: joinGoalName("Join", len(r.Joins), r.JoinProbes), Value: joinRatio(r.Joins, r.JoinProbes), Target: TargetJoinRatio, Unit: "x"})
	}
	if len(r.JoinsWithPolicies) >= 20 {
		add(Goal{Name: joinGoalName(fmt.Sprintf("Join with %d policies", JoinPolicies), len(r.JoinsWithPolicies), r.JoinProbesWithPolicies), Value: joinRatio(r.JoinsWithPolicies, r.JoinProbesWithPolicies), Target: TargetJoinPoliciesRatio, Unit: "x"})
	}
	for _, s := range r.Series() {
		if s.Target == 0 && !s.ZeroTarget || len(s.Y) == 0 {
			continue
		}
		add(Goal{Name: s.Plot + ": " + s.Name, Value: medianOf(s.Y), Target: s.Target, Unit: s.YLabel, AtLeast: s.AtLeast})
	}
	return out
}

// Add puts a series in the report: a plot of its own (or a place in the
// plot named s.Plot) and a row in "Other figures". One call per series.
func (r *Results) Add(s Series) { r.Extra = append(r.Extra, s) }

// AddDurations adds ds, in run order, as points in milliseconds.
func (r *Results) AddDurations(plot, name string, ds []time.Duration) {
	y := make([]float64, len(ds))
	for i, d := range ds {
		y[i] = toMS(d)
	}
	r.Add(Series{Plot: plot, Name: name, XLabel: "run", YLabel: "ms", Y: y, Kind: Points})
}

// AddValue adds one figure as a bar labelled name, in unit.
func (r *Results) AddValue(plot, name, unit string, v float64) {
	r.Add(Series{Plot: plot, Name: name, YLabel: unit, Y: []float64{v}, Kind: Bars})
}

func toMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func durationsMS(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = toMS(d)
	}
	return out
}

// Plot titles of the built-in series.
const (
	PlotDockerRun = "docker run until running and addressed"
	PlotJoin      = "Join latency as the host fills up"
	PlotIPAM      = "IPAM assignment rate"
	PlotMemory    = "daemon memory (VmRSS)"
)

// Series are every series of the report: the built-in ones from the
// fields, then those added with Add.
func (r Results) Series() []Series {
	var out []Series
	run := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			return
		}
		out = append(out, Series{Plot: PlotDockerRun, Name: name, XLabel: "run (interleaved rounds)", YLabel: "ms", Y: durationsMS(ds), Kind: Points, Median: true})
	}
	run("calico", r.RunCalico)
	run("user-defined bridge", r.RunUserBridge)
	run("default bridge", r.RunBridge)
	joinSeries := func(name string, joins []time.Duration) {
		if len(joins) == 0 {
			return
		}
		out = append(out, Series{Plot: PlotJoin, Name: "each Join" + name, XLabel: "endpoints on the host", YLabel: "ms", Y: durationsMS(joins), Kind: Points})
		const win = 50
		med := Series{Plot: PlotJoin, Name: fmt.Sprintf("median of each %d%s", win, name), Kind: Line}
		for end := win; end <= len(joins); end += win {
			med.X = append(med.X, float64(end-win/2))
			med.Y = append(med.Y, toMS(joinWindow(joins, end-win+1, end)))
		}
		out = append(out, med)
	}
	joinSeries("", r.Joins)
	joinSeries(fmt.Sprintf(", %d policies", JoinPolicies), r.JoinsWithPolicies)
	if r.AssignPerSec > 0 || r.AssignPerSec3Hosts > 0 {
		out = append(out, Series{Plot: PlotIPAM, Name: "1 host", YLabel: "assignments/s", Y: []float64{r.AssignPerSec}, Kind: Bars},
			Series{Plot: PlotIPAM, Name: "3 hosts at once", YLabel: "assignments/s", Y: []float64{r.AssignPerSec3Hosts}, Kind: Bars})
	}
	if r.RSSIdleKiB > 0 || r.RSSLoadedKiB > 0 {
		loaded := Series{Plot: PlotMemory, Name: fmt.Sprintf("%d endpoints", len(r.Joins)), YLabel: "MiB", Y: []float64{float64(r.RSSLoadedKiB) / 1024}, Kind: Bars}
		if r.RSSLoadedKiB > 0 {
			loaded.Target = TargetRSSMiB
		}
		out = append(out, Series{Plot: PlotMemory, Name: "idle", YLabel: "MiB", Y: []float64{float64(r.RSSIdleKiB) / 1024}, Kind: Bars}, loaded)
	}
	return append(out, r.Extra...)
}

// plotGroups groups series by Plot, in order of first appearance.
func plotGroups(ss []Series) [][]Series {
	var groups [][]Series
	index := map[string]int{}
	for _, s := range ss {
		i, ok := index[s.Plot]
		if !ok {
			i = len(groups)
			index[s.Plot] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], s)
	}
	return groups
}

// Size of one plot in the PNG; plots are laid out two per row.
const (
	plotW, plotH = 6 * vg.Inch, 4 * vg.Inch
	plotCols     = 2
	plotDPI      = 96
)

// WritePNG draws every plot of the report into one PNG. It opens, across
// the whole width, with the targets panel (Goals) when any figure has a
// target.
func (r Results) WritePNG(w io.Writer) error {
	groups := plotGroups(r.Series())
	if len(groups) == 0 {
		return errors.New("nothing to plot")
	}
	rows := (len(groups) + plotCols - 1) / plotCols
	goals := r.Goals()
	var goalsH vg.Length
	if len(goals) > 0 {
		goalsH = max(plotH, vg.Length(len(goals))*goalRowH+1.5*vg.Inch)
	}
	img := vgimg.NewWith(vgimg.UseWH(plotCols*plotW, vg.Length(rows)*plotH+goalsH), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	if len(goals) > 0 {
		gp, err := goalsPlot(goals)
		if err != nil {
			return fmt.Errorf("targets panel: %w", err)
		}
		top := draw.Crop(dc, 0, 0, vg.Length(rows)*plotH, 0)
		gp.Draw(draw.Crop(top, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3))
		dc = draw.Crop(dc, 0, 0, 0, -goalsH)
	}
	tiles := draw.Tiles{Rows: rows, Cols: plotCols, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3, PadX: vg.Millimeter * 8, PadY: vg.Millimeter * 8}
	for i, g := range groups {
		p, err := makePlot(g)
		if err != nil {
			return fmt.Errorf("plot %q: %w", g[0].Plot, err)
		}
		p.Draw(tiles.At(dc, i%plotCols, i/plotCols))
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// goalRowH is the height of one row of the targets panel.
const goalRowH = 0.35 * vg.Inch

// Colours of the targets panel's bars.
var (
	goalMet    = color.RGBA{R: 0x2e, G: 0x9e, B: 0x4f, A: 0xff}
	goalMissed = color.RGBA{R: 0xd6, G: 0x3b, B: 0x2f, A: 0xff}
)

// goalShareMax is the longest bar of the targets panel: a figure many
// times its target would squeeze every other bar to a sliver; its label
// still carries its value.
const goalShareMax = 4.0

// goalsPlot draws one horizontal bar per goal, its value as a share of its
// target (so every target is the line at 1, and a bar ends at
// goalShareMax), green when met, red when missed; each row's label carries
// the value and the target.
func goalsPlot(goals []Goal) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "every figure against its target (bar: value / target; the line at 1 is the target)"
	p.X.Label.Text = "value / target"
	labels := make([]string, len(goals))
	maxX := 1.0
	for i, g := range goals {
		// The first goal at the top.
		row := len(goals) - 1 - i
		labels[row] = fmt.Sprintf("%s: %s (target %s %s)", g.Name, goalFigure(g.Value, g.Unit), g.bound(), goalFigure(g.Target, g.Unit))
		share := min(g.share(), goalShareMax)
		b, err := plotter.NewBarChart(plotter.Values{share}, goalRowH*0.6)
		if err != nil {
			return nil, err
		}
		b.Horizontal, b.XMin, b.LineStyle.Width = true, float64(row), 0
		b.Color = goalMissed
		if g.Met() {
			b.Color = goalMet
		}
		p.Add(b)
		maxX = max(maxX, share)
	}
	target := &plotter.Line{XYs: plotter.XYs{{X: 1, Y: -0.5}, {X: 1, Y: float64(len(goals)) - 0.5}}, LineStyle: plotter.DefaultLineStyle}
	target.Width, target.Dashes = vg.Points(2), []vg.Length{vg.Points(6), vg.Points(3)}
	p.Add(target)
	p.NominalY(labels...)
	p.X.Min, p.X.Max = 0, maxX*1.1
	// Ticks every 0.25, labelled every 0.5: 1, the target, always has one.
	var ticks []plot.Tick
	for v := 0.0; v <= p.X.Max; v += 0.25 {
		t := plot.Tick{Value: v}
		if math.Mod(v, 0.5) == 0 {
			t.Label = strconv.FormatFloat(v, 'f', -1, 64)
		}
		ticks = append(ticks, t)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min, p.Y.Max = -0.5, float64(len(goals))-0.5
	return p, nil
}

// makePlot draws one group of series with shared axes and a legend.
func makePlot(g []Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = g[0].Plot
	p.X.Label.Text, p.Y.Label.Text = g[0].XLabel, g[0].YLabel
	p.Legend.Top = true
	logY := false
	for _, s := range g {
		logY = logY || (s.LogY && s.Kind != Bars)
	}
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	var bars []string
	entries := 0
	for i, s := range g {
		col := plotutil.Color(i)
		if s.Kind == Bars {
			b, err := plotter.NewBarChart(plotter.Values(s.Y), vg.Points(40))
			if err != nil {
				return nil, err
			}
			b.XMin, b.Color, b.LineStyle.Width = float64(len(bars)), col, 0
			p.Add(b)
			for range s.Y {
				bars = append(bars, s.Name)
			}
			continue
		}
		xys := seriesXYs(s, logY)
		if len(xys) == 0 {
			continue
		}
		switch s.Kind {
		case Line:
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color, l.Width = col, vg.Points(2)
			p.Add(l)
			p.Legend.Add(s.Name, l)
		default:
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			sc.Color, sc.Shape, sc.Radius = col, plotutil.Shape(i), vg.Points(2)
			if len(xys) > 200 {
				sc.Radius = vg.Points(1)
			}
			p.Add(sc)
			p.Legend.Add(s.Name, sc)
			if s.Median {
				p.Add(medianLine(xys, col))
			}
		}
		entries++
	}
	if len(bars) > 0 {
		p.NominalX(bars...)
		p.X.Min, p.X.Max = -0.5, float64(len(bars))-0.5
	}
	// Head room for the legend (top right) above the data.
	if entries > 0 {
		room := 1 + 0.07*float64(entries)
		if logY {
			p.Y.Max *= math.Pow(p.Y.Max/p.Y.Min, room-1)
		} else {
			p.Y.Max += (p.Y.Max - p.Y.Min) * (room - 1)
		}
	}
	return p, nil
}

// medianLine spans the points' X range at their median Y.
func medianLine(xys plotter.XYs, col color.Color) *plotter.Line {
	ys := make([]float64, len(xys))
	for i, xy := range xys {
		ys[i] = xy.Y
	}
	m := medianOf(ys)
	l := &plotter.Line{XYs: plotter.XYs{{X: xys[0].X, Y: m}, {X: xys[len(xys)-1].X, Y: m}}, LineStyle: plotter.DefaultLineStyle}
	l.Color, l.Width = col, vg.Points(1.5)
	return l
}

// seriesXYs are a series' points; on a log axis without those <= 0.
func seriesXYs(s Series, logY bool) plotter.XYs {
	var xys plotter.XYs
	for i, y := range s.Y {
		x := float64(i + 1)
		if s.X != nil {
			if i >= len(s.X) {
				break
			}
			x = s.X[i]
		}
		if logY && y <= 0 || math.IsNaN(y) || math.IsInf(y, 0) {
			continue
		}
		xys = append(xys, plotter.XY{X: x, Y: y})
	}
	return xys
}

// AddBenchOutput adds the figures of `go test -bench` output that
// b.ReportMetric reported (the standard ns/op, B/op and allocs/op are left
// out) as bars: one plot per benchmark and unit, a bar per metric. The
// unit is what follows a metric's last '-' ("p50-ms": p50 in ms,
// "container-Gbit/s": container in Gbit/s); a metric without one ("ratio")
// is a plot of its own.
func (r *Results) AddBenchOutput(in io.Reader, fileName string) error {
	br := benchfmt.NewReader(in, fileName)
	var targets []benchTarget
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue // unit metadata, or a line that is not a result
		}
		bench := strings.TrimPrefix(string(res.Name.Base()), "Benchmark")
		for _, v := range res.Values {
			value, unit := v.Value, v.Unit
			if v.OrigUnit != "" {
				value, unit = v.OrigValue, v.OrigUnit
			}
			switch unit {
			case "ns/op", "B/op", "allocs/op":
				continue
			}
			metric, per := unit, unit
			if i := strings.LastIndexByte(unit, '-'); i > 0 {
				metric, per = unit[:i], unit[i+1:]
			}
			if of, ok := targetOf(metric, per); ok {
				targets = append(targets, benchTarget{plot: fmt.Sprintf("%s (%s)", bench, of.per), metric: of.metric, value: value})
				continue
			}
			r.AddValue(fmt.Sprintf("%s (%s)", bench, per), metric, per, value)
		}
	}
	for _, t := range targets {
		for i := range r.Extra {
			if s := &r.Extra[i]; s.Plot == t.plot && s.Name == t.metric {
				s.Target = t.value
			}
		}
	}
	return br.Err()
}

// benchTarget is the target a benchmark reported for one of its metrics.
type benchTarget struct {
	plot, metric string
	value        float64
}

// targetOf tells a benchmark metric that is the target of another: unit
// "p50-target-ms" is the target of "p50-ms", "ratio-target" that of
// "ratio". Lower is better for those (times, ratios of times).
func targetOf(metric, per string) (of struct{ metric, per string }, ok bool) {
	if per == "target" { // "ratio-target": metric "ratio", no unit
		return struct{ metric, per string }{metric, metric}, true
	}
	if m, found := strings.CutSuffix(metric, "-target"); found {
		return struct{ metric, per string }{m, per}, true
	}
	return of, false
}
