package bench

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotutil"
)

func TestPercentileAndMedian(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		in          []time.Duration
		median, p99 time.Duration
	}{
		{ms(5), 5 * time.Millisecond, 5 * time.Millisecond},
		{ms(4, 1, 3, 2), 2500 * time.Microsecond, 4 * time.Millisecond},
		{ms(9, 1, 5), 5 * time.Millisecond, 9 * time.Millisecond},
		{nil, 0, 0},
	}
	for _, tc := range tests {
		if got := Median(tc.in); got != tc.median {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.median)
		}
		if got := Percentile(tc.in, 99); got != tc.p99 {
			t.Errorf("Percentile(%v, 99) = %v, want %v", tc.in, got, tc.p99)
		}
	}
	// p99 of 30 samples is the largest (nearest rank 30).
	thirty := make([]time.Duration, 30)
	for i := range thirty {
		thirty[i] = time.Duration(i+1) * time.Millisecond
	}
	if got := Percentile(thirty, 99); got != 30*time.Millisecond {
		t.Errorf("p99 of 1..30 ms = %v", got)
	}
}

// TestReportRendering: the markdown carries every figure and the ratios,
// and the PNG is a decodable image with something drawn on it.
func TestReportRendering(t *testing.T) {
	r := Results{
		When: time.Unix(0, 0), Host: "test", Dockerd: "20.10",
		RunCalico:     []time.Duration{110 * time.Millisecond, 120 * time.Millisecond},
		RunBridge:     []time.Duration{100 * time.Millisecond, 100 * time.Millisecond},
		RunUserBridge: []time.Duration{110 * time.Millisecond, 100 * time.Millisecond},
		AssignPerSec:  1234, AssignPerSec3Hosts: 2345, RoundTripsPerAssgn: 1.05, TxnsPerAssign: 1.01, ReadsPerAssign: 0.04,
		RSSIdleKiB: 40 * 1024, RSSLoadedKiB: 60 * 1024,
	}
	for i := 0; i < 1000; i++ {
		r.Joins = append(r.Joins, time.Duration(5+i/100)*time.Millisecond)
	}
	md := requireMarkdown(t, r,
		"| calico (`--driver calico --ipam-driver calico-ipam`) | 2 | 115.0 ms | 120.0 ms |",
		"| ratio calico / default bridge | | 1.15x | 1.20x |",
		"| ratio calico / user-defined bridge | | 1.10x | 1.09x |",
		"Against the user-defined bridge: median ratio 1.10x, meets the target (<= 1.10x); median of the per-round ratios 1.10x.",
		"Against the default bridge: median ratio 1.15x, **misses the target** (<= 1.10x); per-round 1.15x.",
		"| assignments per second, 1 host | 1234 /s |",
		"| etcd round trips per assignment | 1.050",
		"| 10 | 5.0 ms |", "| 1000 | 14.0 ms |",
		"Endpoint 1000 vs endpoint 10 (medians of 10): 2.80x", "medians of 50: first 50 5.0 ms, last 50 14.0 ms, 2.80x",
		"| idle (after start, no endpoints) | 40.0 MiB |", "| with 1000 endpoints | 60.0 MiB |",
		"![plot](report.png)",
	)
	if strings.Contains(md, "## Other figures") {
		t.Error("an \"Other figures\" section without added series")
	}
	m := renderPNG(t, r)
	// The targets panel across the top, then two rows of two plots: docker
	// run, Join, IPAM, memory.
	if b := m.Bounds(); b.Dx() != 2*576 || b.Dy() != 3*384 {
		t.Errorf("plot is %v, want 1152x1152 (the targets panel and two rows of two plots)", b.Size())
	}
	// The first series' colour (calico's points), not just a blank canvas.
	if n := countColor(m, plotutil.Color(0)); n < 100 {
		t.Errorf("only %d pixels of the first series' colour", n)
	}
}

func renderPNG(t *testing.T, r Results) image.Image {
	t.Helper()
	var img bytes.Buffer
	if err := r.WritePNG(&img); err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(&img)
	if err != nil {
		t.Fatalf("the plot is not a PNG: %v", err)
	}
	return m
}

func countColor(m image.Image, c color.Color) int {
	wr, wg, wb, _ := c.RGBA()
	n := 0
	for y := 0; y < m.Bounds().Dy(); y++ {
		for x := 0; x < m.Bounds().Dx(); x++ {
			if r, g, b, _ := m.At(x, y).RGBA(); r>>8 == wr>>8 && g>>8 == wg>>8 && b>>8 == wb>>8 {
				n++
			}
		}
	}
	return n
}

// TestAddSeries: one call adds a series: a new title is a new plot, an
// existing one shares it; go test -bench output becomes bars per unit; a
// log-scale plot with a zero in it renders.
func TestAddSeries(t *testing.T) {
	r := Results{RunCalico: []time.Duration{time.Millisecond, 2 * time.Millisecond}}
	r.AddDurations(PlotDockerRun, "calico -p 8080:80", []time.Duration{3 * time.Millisecond})
	r.Add(Series{Plot: "BGP scale", Name: "convergence", XLabel: "nodes", YLabel: "ms", X: []float64{8, 16, 32}, Y: []float64{0, 120, 900}, Kind: Line, LogY: true})
	bench := `goos: linux
BenchmarkMultiHostBlockConvergence-2   	       1	2000000000 ns/op	        45.50 p50-ms	        80.25 p99-ms	        30.00 withdraw-p50-ms
BenchmarkMultiHostIperf-2   	       1	9000000000 ns/op	         8.000 container-Gbit/s	        10.00 host-Gbit/s	         0.8000 ratio
PASS
`
	if err := r.AddBenchOutput(strings.NewReader(bench), "multihost.txt"); err != nil {
		t.Fatal(err)
	}
	var titles []string
	for _, g := range plotGroups(r.Series()) {
		var names []string
		for _, s := range g {
			names = append(names, s.Name)
		}
		titles = append(titles, g[0].Plot+": "+strings.Join(names, ","))
	}
	want := []string{
		PlotDockerRun + ": calico,calico -p 8080:80",
		"BGP scale: convergence",
		"MultiHostBlockConvergence (ms): p50,p99,withdraw-p50",
		"MultiHostIperf (Gbit/s): container,host",
		"MultiHostIperf (ratio): ratio",
	}
	if !slices.Equal(titles, want) {
		t.Errorf("plots:\n%s\nwant:\n%s", strings.Join(titles, "\n"), strings.Join(want, "\n"))
	}
	requireMarkdown(t, r,
		"| MultiHostBlockConvergence (ms) | p99 | 1 | 80.25 ms | 80.25 ms | 80.25 ms |",
		"| MultiHostIperf (Gbit/s) | container | 1 | 8 Gbit/s | 8 Gbit/s | 8 Gbit/s |",
		"| BGP scale | convergence | 3 | 120 ms | 0 ms | 900 ms |",
	)
	// Five plots: three rows.
	if b := renderPNG(t, r).Bounds(); b.Dy() != 3*384 {
		t.Errorf("plot is %v, want three rows", b.Size())
	}
}

// requireMarkdown renders r's report and checks that it has every line of
// wants.
func requireMarkdown(t *testing.T, r Results, wants ...string) string {
	t.Helper()
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md, "report.png"); err != nil {
		t.Fatal(err)
	}
	for _, want := range wants {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	return md.String()
}
