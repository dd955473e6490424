// Package bench measures calico-cnm side by side with Docker's own bridge
// driver and writes the figures as a markdown report with a PNG plot
// (`make bench`; the measurement itself is TestBenchReport, which needs root
// and dockerd like the end-to-end tests).
package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"slices"
	"strings"
	"time"
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

	// Daemon resident memory, idle and with len(Joins) endpoints.
	RSSIdleKiB, RSSLoadedKiB int64
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
func (r Results) JoinWindow(from, to int) time.Duration {
	from, to = max(from, 1), min(to, len(r.Joins))
	if from > to {
		return 0
	}
	return Median(r.Joins[from-1 : to])
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
		ratio(cm, um), verdict(ratio(cm, um), 1.10), PairedRatio(r.RunCalico, r.RunUserBridge),
		ratio(cm, bm), verdict(ratio(cm, bm), 1.10), PairedRatio(r.RunCalico, r.RunBridge))
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
	p("| endpoints on the host | median Join latency of the last 10 |")
	p("|---|---|")
	for _, n := range JoinCheckpoints {
		if n <= len(r.Joins) {
			p("| %d | %s |", n, ms(r.JoinWindow(n-9, n)))
		}
	}
	first, last := r.JoinWindow(1, 10), r.JoinWindow(len(r.Joins)-9, len(r.Joins))
	p("")
	p("Endpoint %d vs endpoint 10 (medians of 10): %.2fx: %s.", len(r.Joins), ratio(last, first), verdict(ratio(last, first), 1.5))
	if len(r.Joins) >= 100 {
		f50, l50 := r.JoinWindow(1, 50), r.JoinWindow(len(r.Joins)-49, len(r.Joins))
		p("Less noisy, medians of 50: first 50 %s, last 50 %s, %.2fx.", ms(f50), ms(l50), ratio(l50, f50))
	}
	p("")
	p("## Daemon memory (VmRSS)")
	p("")
	p("| state | RSS |")
	p("|---|---|")
	p("| idle (after start, no endpoints) | %.1f MiB |", float64(r.RSSIdleKiB)/1024)
	p("| with %d endpoints | %.1f MiB |", len(r.Joins), float64(r.RSSLoadedKiB)/1024)
	p("")
	p("## The plot")
	p("")
	p("Left: `docker run` latency of every run, calico (blue), user-defined bridge (green) and default bridge (orange), in run order; the lines are the medians. Right: Join latency (ms) of each endpoint against the number of endpoints on the host (grey dots), with the median of each 50 (blue line). Y axes in milliseconds.")
	_, err := io.WriteString(w, b.String())
	return err
}

// ---------------------------------------------------------------- plot

var (
	white  = color.RGBA{255, 255, 255, 255}
	black  = color.RGBA{0, 0, 0, 255}
	grey   = color.RGBA{170, 170, 170, 255}
	light  = color.RGBA{230, 230, 230, 255}
	blue   = color.RGBA{31, 119, 180, 255}
	orange = color.RGBA{255, 127, 14, 255}
	green  = color.RGBA{44, 160, 44, 255}
)

type canvas struct{ *image.RGBA }

func (c canvas) dot(x, y, r int, col color.Color) {
	for dy := -r; dy <= r; dy++ {
		for dx := -r; dx <= r; dx++ {
			if dx*dx+dy*dy <= r*r {
				c.Set(x+dx, y+dy, col)
			}
		}
	}
}

func (c canvas) line(x0, y0, x1, y1 int, col color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		c.Set(x0, y0, col)
		c.Set(x0, y0+1, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// panel is a plot area with its data ranges.
type panel struct {
	c                      canvas
	x0, y0, w, h           int // pixel rectangle (top-left)
	xmin, xmax, ymin, ymax float64
}

func (p panel) px(x, y float64) (int, int) {
	fx := (x - p.xmin) / (p.xmax - p.xmin)
	fy := (y - p.ymin) / (p.ymax - p.ymin)
	return p.x0 + int(fx*float64(p.w)), p.y0 + p.h - int(fy*float64(p.h))
}

func (p panel) frame(title string, yTicks int) {
	for i := 0; i <= yTicks; i++ {
		y := p.ymin + (p.ymax-p.ymin)*float64(i)/float64(yTicks)
		_, py := p.px(p.xmin, y)
		p.c.line(p.x0, py, p.x0+p.w, py, light)
		p.c.text(p.x0-6-textWidth(tick(y), 2), py-5, tick(y), 2, black)
	}
	p.c.line(p.x0, p.y0, p.x0, p.y0+p.h, black)
	p.c.line(p.x0, p.y0+p.h, p.x0+p.w, p.y0+p.h, black)
	p.c.text(p.x0, p.y0-22, title, 2, black)
}

func tick(v float64) string {
	if v >= 10 || v == 0 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func toMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func maxMS(ds ...[]time.Duration) float64 {
	m := 0.0
	for _, s := range ds {
		for _, d := range s {
			m = math.Max(m, toMS(d))
		}
	}
	if m == 0 {
		return 1
	}
	return niceCeil(m * 1.1)
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// WritePNG draws the plot.
func (r Results) WritePNG(w io.Writer) error {
	const W, H = 1200, 520
	img := canvas{image.NewRGBA(image.Rect(0, 0, W, H))}
	for y := 0; y < H; y++ {
		for x := 0; x < W; x++ {
			img.Set(x, y, white)
		}
	}

	// Left: docker run latencies in run order.
	n := max(len(r.RunCalico), len(r.RunBridge), len(r.RunUserBridge), 2)
	left := panel{c: img, x0: 80, y0: 60, w: 440, h: 400, xmin: 0, xmax: float64(n - 1), ymin: 0, ymax: maxMS(r.RunCalico, r.RunBridge, r.RunUserBridge)}
	left.frame("DOCKER RUN MS: CALICO VS BRIDGE", 5)
	for _, s := range []struct {
		ds  []time.Duration
		col color.Color
	}{{r.RunBridge, orange}, {r.RunUserBridge, green}, {r.RunCalico, blue}} {
		for i, d := range s.ds {
			x, y := left.px(float64(i), toMS(d))
			img.dot(x, y, 3, s.col)
		}
		if len(s.ds) > 0 {
			_, y := left.px(0, toMS(Median(s.ds)))
			img.line(left.x0, y, left.x0+left.w, y, s.col)
		}
	}
	img.text(left.x0, left.y0+left.h+14, "RUN NUMBER", 2, black)
	for i, l := range []struct {
		name string
		col  color.Color
	}{{"CALICO", blue}, {"USER BRIDGE", green}, {"BRIDGE", orange}} {
		x := left.x0 + 130 + i*110
		img.dot(x, left.y0+left.h+40, 4, l.col)
		img.text(x+10, left.y0+left.h+34, l.name, 2, l.col)
	}

	// Right: Join latency against endpoints on the host.
	m := max(len(r.Joins), 2)
	right := panel{c: img, x0: 680, y0: 60, w: 480, h: 400, xmin: 1, xmax: float64(m), ymin: 0, ymax: maxMS(r.Joins)}
	right.frame("JOIN MS VS ENDPOINTS ON HOST", 5)
	for i, d := range r.Joins {
		x, y := right.px(float64(i+1), toMS(d))
		img.dot(x, y, 1, grey)
	}
	const win = 50
	px, py := -1, -1
	for end := win; end <= len(r.Joins); end += win {
		x, y := right.px(float64(end-win/2), toMS(r.JoinWindow(end-win+1, end)))
		if px >= 0 {
			img.line(px, py, x, y, blue)
		}
		img.dot(x, y, 3, blue)
		px, py = x, y
	}
	for _, c := range []int{1, m / 2, m} {
		x, _ := right.px(float64(c), 0)
		img.text(x-textWidth(fmt.Sprint(c), 2)/2, right.y0+right.h+6, fmt.Sprint(c), 2, black)
	}
	img.text(right.x0+150, right.y0+right.h+24, "ENDPOINTS", 2, black)
	return png.Encode(w, img.RGBA)
}

// ---------------------------------------------------------------- 3x5 font

// glyphs are 3x5 bitmaps, rows top to bottom, '#' set: enough for the
// plot's labels without a font dependency.
var glyphs = map[rune][5]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"}, '1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"}, '3': {"###", "..#", "###", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"}, '5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"}, '7': {"###", "..#", "..#", "..#", "..#"},
	'8': {"###", "#.#", "###", "#.#", "###"}, '9': {"###", "#.#", "###", "..#", "###"},
	'A': {".#.", "#.#", "###", "#.#", "#.#"}, 'B': {"##.", "#.#", "##.", "#.#", "##."},
	'C': {".##", "#..", "#..", "#..", ".##"}, 'D': {"##.", "#.#", "#.#", "#.#", "##."},
	'E': {"###", "#..", "##.", "#..", "###"}, 'F': {"###", "#..", "##.", "#..", "#.."},
	'G': {".##", "#..", "#.#", "#.#", ".##"}, 'H': {"#.#", "#.#", "###", "#.#", "#.#"},
	'I': {"###", ".#.", ".#.", ".#.", "###"}, 'J': {"..#", "..#", "..#", "#.#", ".#."},
	'K': {"#.#", "#.#", "##.", "#.#", "#.#"}, 'L': {"#..", "#..", "#..", "#..", "###"},
	'M': {"#.#", "###", "###", "#.#", "#.#"}, 'N': {"##.", "#.#", "#.#", "#.#", "#.#"},
	'O': {".#.", "#.#", "#.#", "#.#", ".#."}, 'P': {"##.", "#.#", "##.", "#..", "#.."},
	'Q': {".#.", "#.#", "#.#", "##.", ".##"}, 'R': {"##.", "#.#", "##.", "#.#", "#.#"},
	'S': {".##", "#..", ".#.", "..#", "##."}, 'T': {"###", ".#.", ".#.", ".#.", ".#."},
	'U': {"#.#", "#.#", "#.#", "#.#", "###"}, 'V': {"#.#", "#.#", "#.#", "#.#", ".#."},
	'W': {"#.#", "#.#", "###", "###", "#.#"}, 'X': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'Y': {"#.#", "#.#", ".#.", ".#.", ".#."}, 'Z': {"###", "..#", ".#.", "#..", "###"},
	'.': {"...", "...", "...", "...", ".#."}, ':': {"...", ".#.", "...", ".#.", "..."},
	'-': {"...", "...", "###", "...", "..."}, '/': {"..#", "..#", ".#.", "#..", "#.."},
	' ': {"...", "...", "...", "...", "..."},
}

func textWidth(s string, scale int) int { return len([]rune(s)) * 4 * scale }

// text draws s with its top-left corner at (x, y), each font pixel
// scale x scale.
func (c canvas) text(x, y int, s string, scale int, col color.Color) {
	for _, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs[' ']
		}
		for row, bits := range g {
			for colIdx, ch := range bits {
				if ch != '#' {
					continue
				}
				for dy := 0; dy < scale; dy++ {
					for dx := 0; dx < scale; dx++ {
						c.Set(x+colIdx*scale+dx, y+row*scale+dy, col)
					}
				}
			}
		}
		x += 4 * scale
	}
}
