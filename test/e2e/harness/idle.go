package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// IdleNetwork is the calico network the idle scenario's containers join.
const IdleNetwork = "idlenet"

// IdleMetricsURL is the embedded etcd member's /metrics inside a host's
// netns (the client URL ServeArgs gives it): the requests are counted
// where they arrive, whichever part of the daemon sent them.
const IdleMetricsURL = "http://127.0.0.1:2379/metrics"

// IdleDaemonMetrics is where the scenario's daemon must serve /metrics
// (--metrics-listen, in the host's netns): StartIdleLoad waits there until
// no reconcile pass is due. The last starts' Docker events bring a pass
// seconds later (and perhaps a follow-up for an endpoint Docker did not
// show yet): the load's own work, which must be done before idleness is
// measured.
const IdleDaemonMetrics = "127.0.0.1:9097"

var reconcileScheduled = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(plugin.MetricReconcileScheduled) + ` (\S+)$`)

// idleRunners is how many `docker run` the scenario keeps in flight: each
// runner takes the next container as soon as its last one is up, so one
// slow start does not hold back the nine others as lockstep batches did.
const idleRunners = 10

// IdleRole is the role label of container i among policies policies: the
// containers are spread evenly over the policies' selectors.
func IdleRole(i, policies int) string { return fmt.Sprintf("idle%d", i%policies) }

// IdlePolicyName is the name of the scenario's policy k.
func IdlePolicyName(k int) string { return fmt.Sprintf("idle-%d", k) }

// StartIdleLoad puts the idle scenario on h, whose daemon (binary bin)
// serves with its embedded etcd: a calico network, `policies`
// GlobalNetworkPolicies applied with the CLI (policy k selects role idlek
// and allows TCP 80 from any role), and `containers` busybox containers
// started idleRunners at a time, each labelled with its role. It returns
// once every container runs and every policy's chain is in the kernel.
func (h *Host) StartIdleLoad(t testing.TB, bin string, containers, policies int) {
	t.Helper()
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", IdleNetwork)
	h.ApplyIdlePolicies(t, bin, policies)

	defer StartingCrowd(t)()
	began := time.Now()
	next := make(chan int)
	errs := make(chan error, containers)
	var wg sync.WaitGroup
	for range min(idleRunners, containers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				_, err := h.DockerWithin(CrowdCommandTimeout, "run", "-d", "--name", fmt.Sprintf("idle%03d", i), "--net", IdleNetwork,
					"--label", IdleLabel(i, policies), Image, "sleep", "1000000")
				if err != nil {
					errs <- fmt.Errorf("container %d: %w", i, err)
				}
			}
		}()
	}
	for i := range containers {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: %v", h.Name, err)
	}
	t.Logf("%s: %d containers started in %s", h.Name, containers, time.Since(began).Round(time.Second))
	h.AwaitIdleSettled(t, IdleNetwork, containers, policies)
}

// IdleLabel is the label (--label) of container i of the idle scenario:
// its role among policies policies.
func IdleLabel(i, policies int) string { return policy.LabelPrefix + "role=" + IdleRole(i, policies) }

// ApplyIdlePolicies applies the idle scenario's `policies` policies with
// the CLI (bin) on h.
func (h *Host) ApplyIdlePolicies(t testing.TB, bin string, policies int) {
	t.Helper()
	var docs []string
	for k := range policies {
		docs = append(docs, fmt.Sprintf(idlePolicy, IdlePolicyName(k), 100+k, IdleRole(k, policies)))
	}
	file := filepath.Join(h.Dir, "idle-policies.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustExec(t, bin, "apply", "-f", file)
}

// AwaitIdleSettled waits until the idle scenario's work is done on h:
// `containers` containers run on network, the chain of each of the
// `policies` policies is in the kernel, and the daemon (serving /metrics
// at IdleDaemonMetrics) has no reconcile pass due.
func (h *Host) AwaitIdleSettled(t testing.TB, network string, containers, policies int) {
	t.Helper()
	Eventually(t, 60*time.Second, 500*time.Millisecond, "every container running, every policy in the kernel and no reconcile pass due", func() error {
		out, err := h.Docker(t, "ps", "-q", "--filter", "status=running", "--filter", "network="+network)
		if err != nil {
			return err
		}
		if n := len(strings.Fields(out)); n != containers {
			return fmt.Errorf("%d of %d containers running", n, containers)
		}
		table, err := h.Exec(t, "nft", "list", "table", "ip", policy.TableName)
		if err != nil {
			return err
		}
		for k := range policies {
			if c := policy.PolicyChainName(IdlePolicyName(k), api.Ingress); !strings.Contains(table, "chain "+c+" ") {
				return fmt.Errorf("no chain %s of policy %s yet", c, IdlePolicyName(k))
			}
		}
		metrics, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+IdleDaemonMetrics+"/metrics")
		if err != nil {
			return fmt.Errorf("the daemon's /metrics (is it started with --metrics-listen %s?): %w", IdleDaemonMetrics, err)
		}
		if m := reconcileScheduled.FindStringSubmatch(metrics); m == nil || m[1] != "0" {
			return fmt.Errorf("a reconcile pass is still due (%s %v)", plugin.MetricReconcileScheduled, m)
		}
		return nil
	})
}

// idlePolicy is the scenario's policy: name, order, role it selects.
const idlePolicy = `apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata:
  name: %s
spec:
  order: %d
  selector: role == '%s'
  types:
  - Ingress
  ingress:
  - action: Allow
    protocol: TCP
    source:
      selector: has(role)
    destination:
      ports: [80]
`

// IdleFigures is what a daemon did over an idle window.
type IdleFigures struct {
	Window time.Duration
	// Before are the member's received requests by method from its start
	// to the window: the daemon's start and the scenario's.
	Before map[string]float64
	// Requests are the gRPC requests the etcd member received, by method
	// (Range, Txn, Watch, LeaseKeepAlive, ...): messages, so a watch
	// stream's create and a lease stream's keep-alive each count.
	Requests map[string]float64
	// CPU is the daemon's user+system time over the window.
	CPU time.Duration
	// Warnings are its log lines at warning or above during the window.
	Warnings []string
}

// PerMinute is n requests over the window, per minute.
func (f IdleFigures) PerMinute(method string) float64 {
	return f.Requests[method] / f.Window.Minutes()
}

// CPUPercent is the daemon's CPU use over the window, in % of one core.
func (f IdleFigures) CPUPercent() float64 {
	return 100 * f.CPU.Seconds() / f.Window.Seconds()
}

// String lists the figures, methods in name order.
func (f IdleFigures) String() string {
	methods := make([]string, 0, len(f.Requests))
	for m := range f.Requests {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	var parts []string
	for _, m := range methods {
		parts = append(parts, fmt.Sprintf("%s %.1f/min", m, f.PerMinute(m)))
	}
	if len(parts) == 0 {
		parts = append(parts, "no datastore request")
	}
	return fmt.Sprintf("over %s: %s; CPU %.2f%% of a core; %d warning lines", f.Window, strings.Join(parts, ", "), f.CPUPercent(), len(f.Warnings))
}

// MeasureIdle watches the daemon p on h (embedded etcd) for window while
// nothing is asked of it: the etcd member's received requests by method,
// p's CPU time and its log lines at warning or above.
func (h *Host) MeasureIdle(t testing.TB, p *Process, window time.Duration) IdleFigures {
	t.Helper()
	before, cpu0 := h.etcdRequests(t), ProcessCPU(t, p.Pid())
	logFrom := len(p.Log())
	began := time.Now()
	// The window is the measurement itself, not a wait for something.
	time.Sleep(window)
	after, cpu1 := h.etcdRequests(t), ProcessCPU(t, p.Pid())
	f := IdleFigures{Window: time.Since(began), Before: before, Requests: map[string]float64{}, CPU: cpu1 - cpu0}
	for m, n := range after {
		if d := n - before[m]; d > 0 {
			f.Requests[m] = d
		}
	}
	log := p.Log()
	if len(log) >= logFrom {
		f.Warnings = WarningLines(log[logFrom:])
	}
	return f
}

// grpcReceived is one sample of the member's gRPC received-message counter.
var grpcReceived = regexp.MustCompile(`(?m)^grpc_server_msg_received_total\{([^}]*)\} (\S+)$`)

var grpcMethod = regexp.MustCompile(`grpc_method="([^"]+)"`)

// etcdRequests reads the member's received gRPC messages by method. The
// scrape itself is HTTP, so it counts nothing.
func (h *Host) etcdRequests(t testing.TB) map[string]float64 {
	t.Helper()
	out, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", IdleMetricsURL)
	if err != nil {
		t.Fatalf("%s: etcd /metrics: %v", h.Name, err)
	}
	got := map[string]float64{}
	for _, m := range grpcReceived.FindAllStringSubmatch(out, -1) {
		mm := grpcMethod.FindStringSubmatch(m[1])
		if mm == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("%s: etcd /metrics sample %q: %v", h.Name, m[0], err)
		}
		got[mm[1]] += v
	}
	if len(got) == 0 {
		t.Fatalf("%s: etcd /metrics has no grpc_server_msg_received_total sample:\n%s", h.Name, TailString(out, 20))
	}
	return got
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's
// times: 100 on every Linux ABI Go supports.
const clockTicks = 100

// ProcessCPU is pid's user+system CPU time so far (/proc/<pid>/stat).
func ProcessCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (field 3, state).
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime (fields 14 and 15)
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %q", pid, s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// logrusLevel is the level of one line of the daemon's log (logrus text).
var logrusLevel = regexp.MustCompile(`(?m)^time="[^"]+" level=(\w+) msg=.*$`)

// WarningLines are the lines of a daemon log at warning or above.
func WarningLines(log string) []string {
	var out []string
	for _, m := range logrusLevel.FindAllStringSubmatch(log, -1) {
		switch m[1] {
		case "warning", "error", "fatal", "panic":
			out = append(out, m[0])
		}
	}
	return out
}

// TailString is the last n lines of s.
func TailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
