package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// IPAMBaseline is the commit whose assignment rate the IPAM engine must
// keep: the end of the first round, before the address-safety work.
const IPAMBaseline = "382a2b2"

// Plots of the comparison with IPAMBaseline.
const (
	PlotIPAMRounds = "IPAM assignments/s, " + IPAMBaseline + " and new, interleaved rounds"
	PlotIPAMRatio  = "IPAM assignments/s new / " + IPAMBaseline
)

// ipamCompareRounds: old, new, old, new, old, new, so that the shared
// machine's drift hits both builds alike.
const ipamCompareRounds = 3

// TargetIPAMRatio: the new engine assigns at least as many addresses per
// second as IPAMBaseline (ratio of the medians of the rounds).
const TargetIPAMRatio = 1.0

// autoAssignRate is one run of BenchmarkAutoAssign: assignments per second
// with one host and with three hosts assigning at once, and what the whole
// run (etcd member included) cost: CPU seconds and MiB written to disk,
// figures the shared machine's load moves less than the rates.
type autoAssignRate struct{ oneHost, threeHosts, cpuSec, writtenMiB float64 }

// TestIPAMCompare runs only the comparison with IPAMBaseline and logs it,
// without root or dockerd (CALICO_CNM_BENCH_IPAM=1); TestBenchReport runs
// the same and puts it in the report.
func TestIPAMCompare(t *testing.T) {
	if os.Getenv("CALICO_CNM_BENCH_IPAM") == "" {
		t.Skip("the IPAM comparison with " + IPAMBaseline + " runs with CALICO_CNM_BENCH_IPAM=1 (and in make bench); it takes a few minutes")
	}
	var res Results
	ipamCompareBench(t, &res)
	for _, g := range res.Goals() {
		t.Logf("%s: %.2fx (target >= %.2fx)", g.Name, g.Value, g.Target)
	}
}

// ipamCompareBench builds the ipam test binary of the working tree and of
// IPAMBaseline, runs their BenchmarkAutoAssign alternately, and adds each
// round's figures and the ratios of the medians, new / old, against
// TargetIPAMRatio.
func ipamCompareBench(t *testing.T, res *Results) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root := harness.ModuleRoot(t)
	tmp := t.TempDir() // removed even when a step below fails
	oldRoot := filepath.Join(tmp, "src")
	if err := exportCommit(ctx, root, IPAMBaseline, oldRoot, filepath.Join(tmp, "src.tar")); err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{IPAMBaseline: filepath.Join(tmp, "old.test"), "new": filepath.Join(tmp, "new.test")}
	srcs := map[string]string{IPAMBaseline: oldRoot, "new": root}
	for name, bin := range bins {
		if err := buildIPAMTest(ctx, srcs[name], bin); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var olds, news []autoAssignRate
	for round := 1; round <= ipamCompareRounds; round++ {
		for _, name := range []string{IPAMBaseline, "new"} {
			r, err := runAutoAssign(ctx, bins[name], filepath.Join(srcs[name], "ipam"))
			if err != nil {
				t.Fatalf("%s, round %d: %v", name, round, err)
			}
			t.Logf("IPAM round %d, %s: %.0f assign/s (1 host), %.0f assign/s (3 hosts); the run used %.2f s of CPU and wrote %.1f MiB", round, name, r.oneHost, r.threeHosts, r.cpuSec, r.writtenMiB)
			if name == IPAMBaseline {
				olds = append(olds, r)
			} else {
				news = append(news, r)
			}
		}
	}
	addIPAMCompare(res, olds, news)
}

// exportCommit writes the tree of commit into dir (git archive, not a
// worktree: nothing is registered in the repository to clean up).
func exportCommit(ctx context.Context, repo, commit, dir, tarPath string) error {
	if out, err := exec.CommandContext(ctx, "git", "-C", repo, "archive", "--format=tar", "-o", tarPath, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("exporting %s: %w", commit, err)
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarPath, "-C", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("unpacking %s: %w\n%s", commit, err, out)
	}
	return nil
}

// buildIPAMTest compiles the ipam package's tests of the module at root into
// bin, with the module's own go.mod and the local module cache.
func buildIPAMTest(ctx context.Context, root, bin string) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./ipam")
	cmd.Dir = root
	// An exported tree has no VCS data to stamp, and a go.work above the
	// temporary directory must not pull in other modules.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the ipam tests in %s: %w\n%s", root, err, out)
	}
	return nil
}

// runAutoAssign runs BenchmarkAutoAssign of the test binary bin in dir.
func runAutoAssign(ctx context.Context, bin, dir string) (autoAssignRate, error) {
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", "^BenchmarkAutoAssign$", "-test.benchtime", "3000x", "-test.count", "1")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return autoAssignRate{}, fmt.Errorf("%s: %w\n%s", bin, err, out)
	}
	r, err := parseAutoAssign(string(out))
	if err != nil {
		return autoAssignRate{}, fmt.Errorf("%w\n%s", err, out)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.cpuSec = time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime)).Seconds()
		r.writtenMiB = float64(ru.Oublock) * 512 / (1 << 20) // blocks of 512 bytes
	}
	return r, nil
}

// parseAutoAssign reads assign/s of hosts=1 and hosts=3 from
// BenchmarkAutoAssign output.
func parseAutoAssign(out string) (autoAssignRate, error) {
	var r autoAssignRate
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[0], "BenchmarkAutoAssign/hosts=") {
			continue
		}
		var rate float64
		for i := 2; i+1 < len(f); i += 2 {
			if f[i+1] != "assign/s" {
				continue
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return r, fmt.Errorf("%s assign/s %q: %w", f[0], f[i], err)
			}
			rate = v
		}
		hosts := strings.SplitN(strings.TrimPrefix(f[0], "BenchmarkAutoAssign/hosts="), "-", 2)[0]
		switch hosts {
		case "1":
			r.oneHost = rate
		case "3":
			r.threeHosts = rate
		}
	}
	if r.oneHost == 0 || r.threeHosts == 0 {
		return r, fmt.Errorf("no assign/s for 1 and 3 hosts in the BenchmarkAutoAssign output")
	}
	return r, nil
}

// addIPAMCompare adds each round's assignments per second of IPAMBaseline
// and of the new engine, in run order, and the two targets rows: the
// median of the new rounds over the median of the old, 1 host and 3 hosts.
func addIPAMCompare(res *Results, olds, news []autoAssignRate) {
	rounds := func(rs []autoAssignRate, pick func(autoAssignRate) float64) (x, y []float64) {
		for i, r := range rs {
			x, y = append(x, float64(i+1)), append(y, pick(r))
		}
		return x, y
	}
	one := func(r autoAssignRate) float64 { return r.oneHost }
	three := func(r autoAssignRate) float64 { return r.threeHosts }
	for _, c := range []struct {
		name string
		rs   []autoAssignRate
	}{{IPAMBaseline, olds}, {"new", news}} {
		for _, h := range []struct {
			name string
			pick func(autoAssignRate) float64
		}{{"1 host", one}, {"3 hosts", three}} {
			x, y := rounds(c.rs, h.pick)
			res.Add(Series{Plot: PlotIPAMRounds, Name: fmt.Sprintf("%s, %s (by round: %s)", c.name, h.name, joinFigures(y)),
				XLabel: "round", YLabel: "assignments/s", X: x, Y: y, Kind: Points})
		}
	}
	for _, c := range []struct {
		name string
		rs   []autoAssignRate
	}{{IPAMBaseline, olds}, {"new", news}} {
		x, cpu := rounds(c.rs, func(r autoAssignRate) float64 { return r.cpuSec })
		_, disk := rounds(c.rs, func(r autoAssignRate) float64 { return r.writtenMiB })
		if slices.Max(cpu) > 0 {
			res.Add(Series{Plot: PlotIPAMRounds + " (CPU of each run)", Name: c.name, XLabel: "round", YLabel: "s", X: x, Y: cpu, Kind: Points})
			res.Add(Series{Plot: PlotIPAMRounds + " (disk writes of each run)", Name: c.name, XLabel: "round", YLabel: "MiB", X: x, Y: disk, Kind: Points})
		}
	}
	ratio := func(pick func(autoAssignRate) float64) float64 {
		_, o := rounds(olds, pick)
		_, n := rounds(news, pick)
		return medianOf(n) / medianOf(o)
	}
	res.Add(Series{Plot: PlotIPAMRatio, Name: "1 host", YLabel: "x", Y: []float64{ratio(one)}, Kind: Bars, Target: TargetIPAMRatio, AtLeast: true})
	res.Add(Series{Plot: PlotIPAMRatio, Name: "3 hosts", YLabel: "x", Y: []float64{ratio(three)}, Kind: Bars, Target: TargetIPAMRatio, AtLeast: true})
}

// joinFigures lists a series' figures in run order, for report.md.
func joinFigures(ys []float64) string {
	s := make([]string, len(ys))
	for i, y := range ys {
		s[i] = strconv.FormatFloat(y, 'f', 0, 64)
	}
	return strings.Join(s, ", ")
}

// TestIPAMCompareRows: the rounds' BenchmarkAutoAssign output becomes the
// per-round figures in report.md (rates, CPU, disk writes) and two targets
// rows, the ratio of the medians judged against 1.0 from below.
func TestIPAMCompareRows(t *testing.T) {
	run := func(one, three float64) string {
		return fmt.Sprintf(`goos: linux
BenchmarkAutoAssign/hosts=1-2         	    3000	   1810011 ns/op	       %g assign/s	         0.06267 reads/op	         1.078 roundtrips/op	         1.016 txns/op
BenchmarkAutoAssign/hosts=3-2         	    3000	   1510057 ns/op	       %g assign/s	         0.06400 reads/op	         1.080 roundtrips/op	         1.016 txns/op
PASS
`, one, three)
	}
	var olds, news []autoAssignRate
	for _, f := range [][4]float64{{500, 600, 400, 700}, {520, 640, 560, 650}, {480, 580, 600, 900}} {
		o, err := parseAutoAssign(run(f[0], f[1]))
		if err != nil {
			t.Fatal(err)
		}
		n, err := parseAutoAssign(run(f[2], f[3]))
		if err != nil {
			t.Fatal(err)
		}
		o.cpuSec, o.writtenMiB = 10, 50
		n.cpuSec, n.writtenMiB = 9, 80
		olds, news = append(olds, o), append(news, n)
	}
	var r Results
	addIPAMCompare(&r, olds, news)
	var got []string
	for _, g := range r.Goals() {
		got = append(got, fmt.Sprintf("%s %.2f %s", g.Name, g.Value, verdictWord(g)))
	}
	// Medians: old 500 / 600, new 560 / 700.
	want := []string{PlotIPAMRatio + ": 1 host 1.12 met", PlotIPAMRatio + ": 3 hosts 1.17 met"}
	requireLines(t, "goals", got, want)
	requireMarkdown(t, r,
		"| "+PlotIPAMRatio+": 1 host | 1.12x | >= 1.00x | meets |",
		"| "+PlotIPAMRounds+" | "+IPAMBaseline+", 1 host (by round: 500, 520, 480) | 3 | 500 assignments/s |",
		"| "+PlotIPAMRounds+" | new, 3 hosts (by round: 700, 650, 900) | 3 | 700 assignments/s |",
		"| "+PlotIPAMRounds+" (CPU of each run) | new | 3 | 9 s |",
		"| "+PlotIPAMRounds+" (disk writes of each run) | "+IPAMBaseline+" | 3 | 50 MiB |",
	)

	var slower Results
	addIPAMCompare(&slower, news, olds)
	if g := slower.Goals(); len(g) != 2 || g[0].Met() || g[1].Met() {
		t.Errorf("a new engine slower than %s met its targets: %+v", IPAMBaseline, g)
	}
	if _, err := parseAutoAssign("BenchmarkAutoAssign/hosts=1-2 3000 1 ns/op 500 assign/s\nPASS\n"); err == nil {
		t.Error("output without the 3-host line read as fine")
	}
}
