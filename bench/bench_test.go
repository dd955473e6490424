package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestMain sweeps what crashed runs left behind (the benchmark uses the
// end-to-end harness: netns hosts, dockerd).
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	runsPerNetwork = 30
	warmups        = 2
	joinEndpoints  = 1000
)

// TestBenchReport is `make bench`: it measures, in one run,
//   - `docker run` to running-and-addressed on a calico network vs Docker's
//     bridge networks (user-defined and default) of the same dockerd
//     (interleaved, 30 each);
//   - the IPAM engine's assignments/s and etcd round trips per assignment;
//   - Join latency as the host goes from 1 to 1000 endpoints (CreateEndpoint
//     and Join through the plugin socket, real veths), without policies and
//     again with 50 policies selecting every endpoint (joinBench);
//   - the daemon's RSS idle and with 1000 endpoints;
//   - with 1000 endpoints and 50 policies: a policy update until it is in
//     the kernel (p50, p99), and the daemon's restart until it serves;
//   - a daemon with 100 containers and 10 policies left idle for 60 s:
//     etcd requests per minute by kind, CPU, warning lines;
//
// adds the figures `make bench` measured before it (the multi-host
// benchmarks, the BGP scale rows with a target), and writes report.md and
// report.png in this directory. Opt-in (CALICO_CNM_BENCH=1) because it
// takes minutes.
//
// Partial runs log their figures and write no report:
// CALICO_CNM_BENCH=join measures only the first Join pass (and RSS);
// CALICO_CNM_BENCH=rows the Join passes and what is measured with the host
// full (the issue-20 rows). CALICO_CNM_BENCH_ENDPOINTS sets the endpoints
// per pass (default 1000), to try the code quickly.
func TestBenchReport(t *testing.T) {
	mode := os.Getenv("CALICO_CNM_BENCH")
	if mode == "" {
		t.Skip("the benchmark report runs with CALICO_CNM_BENCH=1 (make bench); it takes several minutes")
	}
	joinOnly, rowsOnly := mode == "join", mode == "rows"
	partial := joinOnly || rowsOnly
	harness.RequirePrereqs(t)
	began := time.Now()
	bin := harness.BuildBinary(t)
	res := Results{When: time.Now(), Host: hostDesc()}

	// The IPAM micro-benchmark first, before dockerd competes for the CPU.
	if !partial {
		ipamBench(t, &res)
		ipamCompareBench(t, &res)
		ipamOwnedBlocksBench(t, &res)
	}

	fab := harness.NewFabric(t, "")
	h, p := startBenchHost(t, fab, bin, "bench")
	res.Dockerd = h.MustDocker(t, "version", "--format", "{{.Server.Version}}")
	time.Sleep(2 * time.Second) // let start-up work (reconcile pass, etcd) settle
	res.RSSIdleKiB = rssKiB(t, p.Pid())

	if partial {
		joinBench(t, fab, bin, h, p, &res, rowsOnly)
		n := len(res.Joins)
		for _, c := range JoinCheckpoints {
			switch {
			case c > n:
			case len(res.JoinsWithPolicies) >= c:
				t.Logf("Join median of endpoints %d-%d: %s; with %d policies: %s", c-9, c, res.JoinWindow(c-9, c), JoinPolicies, joinWindow(res.JoinsWithPolicies, c-9, c))
			default:
				t.Logf("Join median of endpoints %d-%d: %s", c-9, c, res.JoinWindow(c-9, c))
			}
		}
		t.Logf("endpoint %d vs 10 (medians of 10): %.2fx; medians of 50: first %s, last %s; RSS idle %d KiB, loaded %d KiB",
			n, lastToTenth(res.Joins), res.JoinWindow(1, 50), res.JoinWindow(n-49, n), res.RSSIdleKiB, res.RSSLoadedKiB)
		var goals strings.Builder
		res.markdownGoals(func(format string, a ...any) { fmt.Fprintf(&goals, format+"\n", a...) })
		t.Logf("the targets of this run:\n%s", goals.String())
		return
	}
	dockerRunBench(t, h, &res)
	joinBench(t, fab, bin, h, p, &res, true)
	benchOutputs(t, &res)
	idleBench(t, fab, bin, &res)

	var md, img bytes.Buffer
	if err := res.WriteMarkdown(&md, "report.png"); err != nil {
		t.Fatal(err)
	}
	if err := res.WritePNG(&img); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("report.md", md.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("report.png", img.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	t.Logf("wrote %s and %s after %s\n%s", filepath.Join(wd, "report.md"), filepath.Join(wd, "report.png"), time.Since(began).Round(time.Second), md.String())
}

// startBenchHost adds a host with its dockerd and the daemon the Join
// passes measure.
func startBenchHost(t *testing.T, fab *harness.Fabric, bin, name string) (*harness.Host, *harness.Process) {
	t.Helper()
	h := fab.AddHost(t, name, harness.HostOptions{Bridge: true})
	h.ImportBusybox(t)
	// Info logging: debug lines for 1000 endpoints would be measured too.
	// Reconcile must not remove the socket-driven endpoints Docker does
	// not know about while they are measured.
	p := h.StartPlugin(t, bin, nil, append(h.ServeArgs(nil), "--log-level", "info", "--reconcile-grace", "1h", "--metrics-listen", benchMetricsAddr)...)
	return h, p
}

// benchOutputs adds the figures of the benchmarks `make bench` ran before
// and saved in files: the multi-host benchmarks (BGP block convergence,
// iperf3 throughput; CALICO_CNM_BENCH_MULTIHOST) and the BGP scale rows
// with a target (CALICO_CNM_BENCH_SCALE, which BenchmarkBGPScale writes
// for CNM_BGP_SCALE_TARGETS).
func benchOutputs(t *testing.T, res *Results) {
	for _, f := range []struct{ env, what string }{
		{"CALICO_CNM_BENCH_MULTIHOST", "BGP convergence or throughput figures"},
		{"CALICO_CNM_BENCH_SCALE", "BGP scale targets"},
	} {
		path := os.Getenv(f.env)
		if path == "" {
			t.Logf("%s not set: the report has no %s", f.env, f.what)
			continue
		}
		addBenchFile(t, res, path)
	}
}

func addBenchFile(t *testing.T, res *Results, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("benchmark output for the report: %v", err)
	}
	defer f.Close()
	if err := res.AddBenchOutput(f, path); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
}

func hostDesc() string {
	var u syscall.Utsname
	kernel := "linux"
	if syscall.Uname(&u) == nil {
		var b []byte
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			b = append(b, byte(c))
		}
		kernel = "Linux " + string(b)
	}
	return fmt.Sprintf("%s, %d CPUs, %s", kernel, runtime.NumCPU(), runtime.Version())
}

// rssKiB is VmRSS of pid.
func rssKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// ipamBench runs ipam.BenchmarkAutoAssign and reads its custom metrics.
func ipamBench(t *testing.T, res *Results) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkAutoAssign$", "-benchtime", "3000x", "-count", "1", "./ipam/")
	cmd.Dir = harness.ModuleRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ipam benchmark: %v\n%s", err, out)
	}
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || !strings.HasPrefix(f[0], "BenchmarkAutoAssign/hosts=") {
			continue
		}
		metric := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				metric[f[i+1]] = v
			}
		}
		switch {
		case strings.HasPrefix(f[0], "BenchmarkAutoAssign/hosts=1"):
			res.AssignPerSec = metric["assign/s"]
			res.RoundTripsPerAssgn = metric["roundtrips/op"]
			res.TxnsPerAssign = metric["txns/op"]
			res.ReadsPerAssign = metric["reads/op"]
			found++
		case strings.HasPrefix(f[0], "BenchmarkAutoAssign/hosts=3"):
			res.AssignPerSec3Hosts = metric["assign/s"]
			found++
		}
	}
	if found != 2 || res.AssignPerSec == 0 || res.RoundTripsPerAssgn == 0 {
		t.Fatalf("could not read assign/s and roundtrips/op from the ipam benchmark:\n%s", out)
	}
	t.Logf("IPAM: %.0f assign/s (1 host), %.0f assign/s (3 hosts), %.3f round trips/assignment", res.AssignPerSec, res.AssignPerSec3Hosts, res.RoundTripsPerAssgn)
}

// dockerRunBench times `docker run -d` plus the inspect that confirms the
// container runs and has its address, in rounds of one run on each network
// (calico, a user-defined bridge, the default bridge) with the order
// rotating, so that drift on the shared machine hits all alike.
func dockerRunBench(t *testing.T, h *harness.Host, res *Results) {
	t.Helper()
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "calico-net")
	h.MustDocker(t, "network", "create", "--driver", "bridge", "--subnet", "10.99.0.0/16", "bridge-net")
	once := func(network, name string) time.Duration {
		start := time.Now()
		h.MustDocker(t, "run", "-d", "--name", name, "--net", network, harness.Image, "sleep", "3600")
		tmpl := fmt.Sprintf(`{{.State.Running}} {{(index .NetworkSettings.Networks %q).IPAddress}}`, network)
		out := h.MustDocker(t, "inspect", "-f", tmpl, name)
		took := time.Since(start)
		if f := strings.Fields(out); len(f) != 2 || f[0] != "true" || f[1] == "" {
			t.Fatalf("%s on %s is not running with an address: %q", name, network, out)
		}
		h.MustDocker(t, "rm", "-f", name)
		return took
	}
	series := map[string]*[]time.Duration{"calico-net": &res.RunCalico, "bridge-net": &res.RunUserBridge, "bridge": &res.RunBridge}
	networks := []string{"calico-net", "bridge-net", "bridge"}
	for i := 0; i < warmups; i++ {
		for _, nw := range networks {
			once(nw, fmt.Sprintf("warm-%s-%d", nw, i))
		}
	}
	for i := 0; i < runsPerNetwork; i++ {
		for k := range networks {
			nw := networks[(i+k)%len(networks)]
			*series[nw] = append(*series[nw], once(nw, fmt.Sprintf("run-%s-%d", nw, i)))
		}
	}
	t.Logf("docker run medians: calico %s, user-defined bridge %s, default bridge %s", Median(res.RunCalico), Median(res.RunUserBridge), Median(res.RunBridge))
}

func randomID(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func pluginPid(t *testing.T, h *harness.Host) int {
	t.Helper()
	for _, p := range h.Processes() {
		if strings.HasPrefix(p.Name, "plugin") && p.Running() {
			return p.Pid()
		}
	}
	t.Fatal("the plugin is not running")
	return 0
}

func countCali(t *testing.T, h *harness.Host) int {
	t.Helper()
	out := h.MustExec(t, "ip", "-o", "link", "show")
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "cali") {
			n++
		}
	}
	return n
}
