package bench

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
	"time"
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
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md, "report.png"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
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
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	var img bytes.Buffer
	if err := r.WritePNG(&img); err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(&img)
	if err != nil {
		t.Fatalf("the plot is not a PNG: %v", err)
	}
	if b := m.Bounds(); b.Dx() != 1200 || b.Dy() != 520 {
		t.Errorf("plot is %v", b)
	}
	// Blue points/lines exist (calico series), not just a blank canvas.
	blues := 0
	for y := 0; y < m.Bounds().Dy(); y++ {
		for x := 0; x < m.Bounds().Dx(); x++ {
			if r, g, b, _ := m.At(x, y).RGBA(); r>>8 == 31 && g>>8 == 119 && b>>8 == 180 {
				blues++
			}
		}
	}
	if blues < 100 {
		t.Errorf("only %d blue pixels in the plot", blues)
	}
}
