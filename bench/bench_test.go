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
//     and Join through the plugin socket, real veths);
//   - the daemon's RSS idle and with 1000 endpoints;
//   - a daemon with 100 containers and 10 policies left idle for 60 s:
//     etcd requests per minute by kind, CPU, warning lines;
//
// and writes report.md and report.png in this directory. Opt-in
// (CALICO_CNM_BENCH=1) because it takes minutes.
//
// CALICO_CNM_BENCH=join measures only the Join latency (and RSS): it logs
// the medians at each checkpoint and writes no report.
func TestBenchReport(t *testing.T) {
	mode := os.Getenv("CALICO_CNM_BENCH")
	if mode == "" {
		t.Skip("the benchmark report runs with CALICO_CNM_BENCH=1 (make bench); it takes several minutes")
	}
	joinOnly := mode == "join"
	harness.RequirePrereqs(t)
	began := time.Now()
	bin := harness.BuildBinary(t)
	res := Results{When: time.Now(), Host: hostDesc()}

	// The IPAM micro-benchmark first, before dockerd competes for the CPU.
	if !joinOnly {
		ipamBench(t, &res)
		ipamCompareBench(t, &res)
		ipamOwnedBlocksBench(t, &res)
	}

	fab := harness.NewFabric(t, "")
	h := fab.AddHost(t, "bench", harness.HostOptions{Bridge: true})
	h.ImportBusybox(t)
	// Info logging: debug lines for 1000 endpoints would be measured too.
	// Reconcile must not remove the socket-driven endpoints Docker does
	// not know about while they are measured.
	p := h.StartPlugin(t, bin, nil, append(h.ServeArgs(nil), "--log-level", "info", "--reconcile-grace", "1h")...)
	res.Dockerd = h.MustDocker(t, "version", "--format", "{{.Server.Version}}")
	time.Sleep(2 * time.Second) // let start-up work (reconcile pass, etcd) settle
	res.RSSIdleKiB = rssKiB(t, p.Pid())

	if joinOnly {
		joinBench(t, h, &res)
		for _, n := range JoinCheckpoints {
			t.Logf("Join median of endpoints %d-%d: %s", n-9, n, res.JoinWindow(n-9, n))
		}
		first, last := res.JoinWindow(1, 10), res.JoinWindow(joinEndpoints-9, joinEndpoints)
		t.Logf("endpoint 1000 vs 10 (medians of 10): %.2fx; medians of 50: first %s, last %s; RSS idle %d KiB, loaded %d KiB",
			float64(last)/float64(first), res.JoinWindow(1, 50), res.JoinWindow(joinEndpoints-49, joinEndpoints), res.RSSIdleKiB, res.RSSLoadedKiB)
		return
	}
	dockerRunBench(t, h, &res)
	joinBench(t, h, &res)
	multiHostBench(t, &res)
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

// multiHostBench adds the multi-host benchmarks' figures (BGP block
// convergence, iperf3 throughput) that `make bench` ran first and saved in
// the file CALICO_CNM_BENCH_MULTIHOST names.
func multiHostBench(t *testing.T, res *Results) {
	path := os.Getenv("CALICO_CNM_BENCH_MULTIHOST")
	if path == "" {
		t.Log("CALICO_CNM_BENCH_MULTIHOST not set: the report has no BGP convergence or throughput figures")
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the multi-host benchmark output: %v", err)
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

// joinBench fills the host with endpoints through the plugin sockets, as
// dockerd would for containers (RequestAddress, CreateEndpoint, Join), and
// times each Join; then removes them all again (Leave, DeleteEndpoint,
// ReleaseAddress) and checks nothing is left.
func joinBench(t *testing.T, h *harness.Host, res *Results) {
	t.Helper()
	nsock := filepath.Join(h.PluginDir, harness.NetworkSocket)
	isock := filepath.Join(h.PluginDir, harness.IpamSocket)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	call := func(sock, method string, req, resp any) {
		t.Helper()
		if err := harness.PluginCall(ctx, sock, method, req, resp); err != nil {
			t.Fatalf("%v", err)
		}
	}
	var pool struct{ PoolID string }
	call(isock, "/IpamDriver.RequestPool", map[string]any{"AddressSpace": "CalicoLocalAddressSpace", "Pool": "10.128.0.0/16", "Options": map[string]string{"calico.create-pool": "true"}}, &pool)
	netID := randomID(t)
	call(nsock, "/NetworkDriver.CreateNetwork", map[string]any{
		"NetworkID": netID,
		"Options":   map[string]any{},
		"IPv4Data":  []map[string]any{{"AddressSpace": "CalicoLocalAddressSpace", "Pool": pool.PoolID, "Gateway": "0.0.0.0/0"}},
	}, nil)

	type ep struct{ id, addr string }
	eps := make([]ep, 0, joinEndpoints)
	defer func() {
		// Cleanup also when the measurement failed half-way.
		for _, e := range eps {
			_ = harness.PluginCall(ctx, nsock, "/NetworkDriver.Leave", map[string]any{"NetworkID": netID, "EndpointID": e.id}, nil)
			_ = harness.PluginCall(ctx, nsock, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": netID, "EndpointID": e.id}, nil)
			_ = harness.PluginCall(ctx, isock, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": pool.PoolID, "Address": e.addr}, nil)
		}
		_ = harness.PluginCall(ctx, nsock, "/NetworkDriver.DeleteNetwork", map[string]any{"NetworkID": netID}, nil)
	}()
	start := time.Now()
	for i := 0; i < joinEndpoints; i++ {
		var addr struct{ Address string }
		call(isock, "/IpamDriver.RequestAddress", map[string]any{"PoolID": pool.PoolID}, &addr)
		e := ep{id: randomID(t), addr: addr.Address}
		eps = append(eps, e)
		call(nsock, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": netID, "EndpointID": e.id, "Options": map[string]any{}, "Interface": map[string]any{"Address": e.addr}}, nil)
		t0 := time.Now()
		var join struct{ InterfaceName struct{ SrcName string } }
		call(nsock, "/NetworkDriver.Join", map[string]any{"NetworkID": netID, "EndpointID": e.id, "SandboxKey": "/var/run/docker/netns/bench" + strconv.Itoa(i), "Options": map[string]any{}}, &join)
		res.Joins = append(res.Joins, time.Since(t0))
		if join.InterfaceName.SrcName == "" {
			t.Fatalf("Join of endpoint %d answered no interface", i)
		}
	}
	t.Logf("%d endpoints joined in %s; Join median of first 10 %s, of last 10 %s", joinEndpoints, time.Since(start).Round(time.Millisecond), res.JoinWindow(1, 10), res.JoinWindow(joinEndpoints-9, joinEndpoints))
	if n := countCali(t, h); n != joinEndpoints {
		t.Errorf("%d cali veths on the host with %d endpoints joined", n, joinEndpoints)
	}
	res.RSSLoadedKiB = rssKiB(t, pluginPid(t, h))

	for _, e := range eps {
		call(nsock, "/NetworkDriver.Leave", map[string]any{"NetworkID": netID, "EndpointID": e.id}, nil)
		call(nsock, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": netID, "EndpointID": e.id}, nil)
		call(isock, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": pool.PoolID, "Address": e.addr}, nil)
	}
	eps = nil
	if n := countCali(t, h); n != 0 {
		t.Errorf("%d cali veths left after removing every endpoint", n)
	}
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
