package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// The Join passes (issue 20): the host is filled with joinEndpoints
// endpoints through the plugin sockets, as dockerd would for containers,
// once without policies and once more from empty with JoinPolicies
// policies selecting every endpoint; with the second pass's endpoints in
// place, a policy change is timed to the kernel and the daemon is
// restarted and timed to serving.
const (
	// joinNetwork is the Docker network the endpoints join: a network
	// Docker knows, as every real one is, so that the daemon learns
	// labels the way it does for containers.
	joinNetwork = "joinnet"
	joinSubnet  = "10.128.0.0/16"
	// joinLabels is a container created on joinNetwork and never started:
	// to the daemon it is the one container that may be joining, so each
	// endpoint gets its labels (plus its own driver-option labels, which
	// make every endpoint's label set different, as containers' names do).
	joinLabels = "joinlabels"
	// joinRoles is how many role labels the endpoints and policies spread
	// over.
	joinRoles = 10
	// benchMetricsAddr is the daemon's /healthz (and /metrics) inside the
	// bench host's namespace.
	benchMetricsAddr = "127.0.0.1:9091"
	// policyUpdates is how many policy changes are timed to the kernel.
	policyUpdates = 20
	// refEndpoints is what the reference host holds while its probes
	// measure the Join at 10 endpoints (the probe is not counted).
	refEndpoints = 10
)

// Plot titles of the issue-20 rows measured here.
const (
	PlotPolicyUpdate = "policy update reaching the kernel, 1000 endpoints, 50 policies"
	PlotStart        = "start to serving, 1000 endpoints, 50 policies"
	// TargetPolicyUpdateMS is the most p50 of a policy update to the kernel.
	TargetPolicyUpdateMS = 50
	// TargetStartS is the most time from the daemon's exec to serving.
	TargetStartS = 2
)

// joinCount is the endpoints each pass fills the host with:
// CALICO_CNM_BENCH_ENDPOINTS (a quick try of the code), else joinEndpoints.
func joinCount(t *testing.T) int {
	v := os.Getenv("CALICO_CNM_BENCH_ENDPOINTS")
	if v == "" {
		return joinEndpoints
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 20 {
		t.Fatalf("CALICO_CNM_BENCH_ENDPOINTS=%q: want a count >= 20", v)
	}
	return n
}

// joinNet is the network the passes fill, with a datastore client of the
// daemon's embedded member.
type joinNet struct {
	h            *harness.Host
	ctx          context.Context
	nsock, isock string
	netID        string
	poolID       string
	store        *datastore.Store
	eps          []joinEndpoint
}

type joinEndpoint struct{ id, addr string }

func newJoinNet(ctx context.Context, t *testing.T, h *harness.Host) *joinNet {
	t.Helper()
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", joinSubnet,
		"--ipam-opt", "calico.create-pool=true", joinNetwork)
	h.MustDocker(t, "create", "--name", joinLabels, "--net", joinNetwork, "--label", policy.LabelPrefix+"bench=join", harness.Image, "true")
	jn := &joinNet{h: h, ctx: ctx,
		nsock:  filepath.Join(h.PluginDir, harness.NetworkSocket),
		isock:  filepath.Join(h.PluginDir, harness.IpamSocket),
		netID:  strings.TrimSpace(h.MustDocker(t, "network", "inspect", "-f", "{{.Id}}", joinNetwork)),
		poolID: joinSubnet, // calico-ipam's PoolID of a --subnet network
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.WarnLevel)
	store, err := datastore.Open(ctx, datastore.Config{Endpoints: []string{"http://" + h.Forward(t, embeddedClientAddr(t, h))}}, quiet)
	if err != nil {
		t.Fatalf("datastore client of the bench host: %v", err)
	}
	jn.store = store
	t.Cleanup(func() {
		// Also when a measurement failed half-way; the daemon may be down.
		jn.removeAll()
		store.Close()
		_, _ = h.Docker(t, "rm", "-f", joinLabels)
		_, _ = h.Docker(t, "network", "rm", joinNetwork)
	})
	jn.awaitLabels(t)
	return jn
}

// awaitLabels joins and removes a probe endpoint until it is joined with
// known labels: the daemon learns of the labels container from Docker's
// create event, after `docker create` returned.
func (jn *joinNet) awaitLabels(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "an endpoint joined with the labels of "+joinLabels, func() error {
		var addr struct{ Address string }
		jn.call(t, jn.isock, "/IpamDriver.RequestAddress", map[string]any{"PoolID": jn.poolID}, &addr)
		e := joinEndpoint{id: randomID(t), addr: addr.Address}
		jn.eps = append(jn.eps, e)
		jn.call(t, jn.nsock, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id, "Options": map[string]any{policy.LabelPrefix + "role": "probe"}, "Interface": map[string]any{"Address": e.addr}}, nil)
		jn.call(t, jn.nsock, "/NetworkDriver.Join", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id, "SandboxKey": "/var/run/docker/netns/benchprobe", "Options": map[string]any{}}, nil)
		err := jn.labelsKnown(e.id)
		jn.empty(t)
		return err
	})
}

// embeddedClientAddr is where the daemon's embedded etcd member listens
// inside the host's namespace, as harness.ServeArgs configures it.
func embeddedClientAddr(t *testing.T, h *harness.Host) string {
	t.Helper()
	args := h.ServeArgs(nil)
	i := slices.Index(args, "--etcd-listen-client")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("the daemon's arguments name no embedded etcd client URL: %v", args)
	}
	u, err := url.Parse(args[i+1])
	if err != nil || u.Host == "" {
		t.Fatalf("embedded etcd client URL %q: %v", args[i+1], err)
	}
	return u.Host
}

func (jn *joinNet) call(t *testing.T, sock, method string, req, resp any) {
	t.Helper()
	if err := harness.PluginCall(jn.ctx, sock, method, req, resp); err != nil {
		t.Fatalf("%v", err)
	}
}

// fill adds n endpoints (RequestAddress, CreateEndpoint, Join) and
// returns each Join's latency. Endpoint i has the driver-option labels
// role=r<i mod joinRoles> and ep=<i>.
func (jn *joinNet) fill(t *testing.T, n int) []time.Duration {
	t.Helper()
	joins := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		e := jn.add(t, i, strconv.Itoa(i))
		joins = append(joins, e.join)
		if i == 0 {
			jn.requireLabels(t, e.id)
		}
	}
	t.Logf("%d endpoints joined on %s in %s; Join median of first 10 %s, of last 10 %s", n, jn.h.Name, time.Since(start).Round(time.Millisecond), joinWindow(joins, 1, 10), joinWindow(joins, n-9, n))
	if got := countCali(t, jn.h); got != len(jn.eps) {
		t.Errorf("%d cali veths on %s with %d endpoints joined", got, jn.h.Name, len(jn.eps))
	}
	return joins
}

// joinedEndpoint is an endpoint add made, with its Join's latency.
type joinedEndpoint struct {
	joinEndpoint
	join time.Duration
}

// add requests an address, creates endpoint i with the labels role=r<i mod
// joinRoles> and ep=<name>, and joins it, timing the Join.
func (jn *joinNet) add(t *testing.T, i int, name string) joinedEndpoint {
	t.Helper()
	var addr struct{ Address string }
	jn.call(t, jn.isock, "/IpamDriver.RequestAddress", map[string]any{"PoolID": jn.poolID}, &addr)
	e := joinEndpoint{id: randomID(t), addr: addr.Address}
	jn.eps = append(jn.eps, e)
	opts := map[string]any{policy.LabelPrefix + "role": fmt.Sprintf("r%d", i%joinRoles), policy.LabelPrefix + "ep": name}
	jn.call(t, jn.nsock, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id, "Options": opts, "Interface": map[string]any{"Address": e.addr}}, nil)
	t0 := time.Now()
	var join struct{ InterfaceName struct{ SrcName string } }
	jn.call(t, jn.nsock, "/NetworkDriver.Join", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id, "SandboxKey": "/var/run/docker/netns/bench-" + name, "Options": map[string]any{}}, &join)
	took := time.Since(t0)
	if join.InterfaceName.SrcName == "" {
		t.Fatalf("Join of endpoint %s answered no interface", name)
	}
	return joinedEndpoint{joinEndpoint: e, join: took}
}

// interleavedProbes joins JoinProbeCount probe endpoints on full (the
// host filled up) and as many on ref (a host holding 10 endpoints), in
// turns, each removed (Leave, DeleteEndpoint, ReleaseAddress) before the
// next: the Join at each size, measured over the same minute, each host
// first in half of the turns. Measured one after the other, a host's busy
// spell (a disk flush, another process) lands on one size only, and moved
// the ratio by half either way.
func interleavedProbes(t *testing.T, full, ref *joinNet) JoinProbes {
	t.Helper()
	var p JoinProbes
	for k := range JoinProbeCount {
		// Each host goes first in every other turn: the removal of one
		// host's probe overlaps the other's Join equally often both ways.
		if k%2 == 0 {
			p.AtFull = append(p.AtFull, full.probe(t, k))
			p.At10 = append(p.At10, ref.probe(t, k))
		} else {
			p.At10 = append(p.At10, ref.probe(t, k))
			p.AtFull = append(p.AtFull, full.probe(t, k))
		}
	}
	t.Logf("probe Joins: median %s with %d endpoints on %s, %s with %d on %s", Median(p.AtFull), len(full.eps), full.h.Name, Median(p.At10), len(ref.eps), ref.h.Name)
	return p
}

// probe joins probe endpoint k, removes it, and returns its Join's latency.
func (jn *joinNet) probe(t *testing.T, k int) time.Duration {
	t.Helper()
	e := jn.add(t, k, "probe"+strconv.Itoa(k))
	jn.removeLast(t)
	return e.join
}

// requireLabels fails unless the endpoint was joined with known labels:
// a policy selects only such endpoints (unknown ones fail closed).
func (jn *joinNet) requireLabels(t *testing.T, id string) {
	t.Helper()
	if err := jn.labelsKnown(id); err != nil {
		t.Fatalf("the first endpoint: %v", err)
	}
}

func (jn *joinNet) labelsKnown(id string) error {
	var ep datastore.Endpoint
	if _, err := jn.store.GetJSON(jn.ctx, datastore.EndpointKey(jn.h.Name, id), &ep); err != nil {
		return fmt.Errorf("endpoint record: %w", err)
	}
	if ep.LabelsUnknown || ep.Labels["role"] == "" || ep.Labels["bench"] != "join" {
		return fmt.Errorf("joined without the labels policies select on: labels %v, unknown %v", ep.Labels, ep.LabelsUnknown)
	}
	return nil
}

// empty removes every endpoint (Leave, DeleteEndpoint, ReleaseAddress)
// and checks nothing is left.
func (jn *joinNet) empty(t *testing.T) {
	t.Helper()
	for len(jn.eps) > 0 {
		jn.removeLast(t)
	}
	if n := countCali(t, jn.h); n != 0 {
		t.Errorf("%d cali veths left after removing every endpoint", n)
	}
}

// removeLast removes the endpoint added last.
func (jn *joinNet) removeLast(t *testing.T) {
	t.Helper()
	e := jn.eps[len(jn.eps)-1]
	jn.call(t, jn.nsock, "/NetworkDriver.Leave", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id}, nil)
	jn.call(t, jn.nsock, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id}, nil)
	jn.call(t, jn.isock, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": jn.poolID, "Address": e.addr}, nil)
	jn.eps = jn.eps[:len(jn.eps)-1]
}

// removeAll is empty without checks, for a measurement that failed.
func (jn *joinNet) removeAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, e := range jn.eps {
		_ = harness.PluginCall(ctx, jn.nsock, "/NetworkDriver.Leave", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id}, nil)
		_ = harness.PluginCall(ctx, jn.nsock, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": jn.netID, "EndpointID": e.id}, nil)
		_ = harness.PluginCall(ctx, jn.isock, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": jn.poolID, "Address": e.addr}, nil)
	}
	jn.eps = nil
}

// joinPolicyName is the name of the second pass's policy k.
func joinPolicyName(k int) string { return fmt.Sprintf("jp%d", k) }

// joinPolicy is policy k of the second pass, as in
// BenchmarkMultiHostJoinWithPolicies: it selects every endpoint and has
// three rules, the first allowing TCP to port from role r<k mod joinRoles>.
func joinPolicy(t *testing.T, k, port int) api.GlobalNetworkPolicy {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: %s}\nspec:\n  order: %d\n  selector: has(role)\n  ingress:\n"+
		"  - {action: Allow, protocol: TCP, source: {selector: \"role == 'r%d'\"}, destination: {ports: [%d]}}\n  - {action: Log}\n  - {action: Pass, source: {nets: [10.%d.0.0/16]}}\n",
		joinPolicyName(k), k, k%joinRoles, port, k)
	ps, err := api.Decode(strings.NewReader(doc))
	if err != nil || len(ps) != 1 {
		t.Fatalf("policy %d: %v (%d decoded)", k, err, len(ps))
	}
	return ps[0]
}

// applyJoinPolicies writes the JoinPolicies policies; removed when t ends.
func (jn *joinNet) applyJoinPolicies(t *testing.T) {
	t.Helper()
	var ps []api.GlobalNetworkPolicy
	for k := range JoinPolicies {
		ps = append(ps, joinPolicy(t, k, 1000+k))
	}
	if _, err := api.Apply(jn.ctx, jn.store, ps); err != nil {
		t.Fatalf("applying %d policies: %v", JoinPolicies, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for k := range JoinPolicies {
			_ = api.Delete(ctx, jn.store, joinPolicyName(k))
		}
	})
}

// policyChains are the names of the chains of the host's IPv4 policy
// table (`nft list chains` lists chains without their rules, so its cost
// does not grow with the rules).
func policyChains(t *testing.T, h *harness.Host) map[string]bool {
	t.Helper()
	out := h.MustExec(t, "nft", "list", "chains", "ip")
	chains := map[string]bool{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "table":
			in = f[2] == policy.TableName
		case in && len(f) >= 2 && f[0] == "chain":
			chains[f[1]] = true
		}
	}
	return chains
}

// requirePolicyChains fails unless every policy's chain is in the host's
// kernel (they exist only while the policy selects a local endpoint).
func requirePolicyChains(t *testing.T, h *harness.Host) {
	t.Helper()
	chains := policyChains(t, h)
	for k := range JoinPolicies {
		if c := policy.PolicyChainName(joinPolicyName(k), api.Ingress); !chains[c] {
			t.Fatalf("no chain %s of policy %s in the kernel with the host full (%d chains)", c, joinPolicyName(k), len(chains))
		}
	}
}

// nftMonitor follows the rules added in the host's kernel (`nft monitor`):
// a change is seen when it is committed, without listing a table whose
// size grows with the endpoints.
type nftMonitor struct {
	lines chan string
}

func startNFTMonitor(t *testing.T, h *harness.Host) *nftMonitor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+h.NetnsPath, "--", "nft", "monitor", "rules")
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("nft monitor: %v", err)
	}
	m := &nftMonitor{lines: make(chan string, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "add rule ") {
				select {
				case m.lines <- sc.Text():
				default: // nobody waits for these: an unrelated burst
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return m
}

// await waits until a rule matching re is added, or timeout.
func (m *nftMonitor) await(re *regexp.Regexp, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case line := <-m.lines:
			if re.MatchString(line) {
				return nil
			}
		case <-deadline.C:
			return fmt.Errorf("no rule matching %s added within %s", re, timeout)
		}
	}
}

// drain forgets the rules seen so far.
func (m *nftMonitor) drain() {
	for {
		select {
		case <-m.lines:
		default:
			return
		}
	}
}

// policyUpdateBench changes policy 0's first rule (its port) policyUpdates
// times through the datastore, as `calico-cnm apply` does, and times each
// change until the rule with the new port is in the host's kernel.
func (jn *joinNet) policyUpdateBench(t *testing.T) []time.Duration {
	t.Helper()
	m := startNFTMonitor(t, jn.h)
	chain := policy.PolicyChainName(joinPolicyName(0), api.Ingress)
	update := func(port int) (time.Duration, error) {
		m.drain()
		re := regexp.MustCompile(`^add rule ip ` + regexp.QuoteMeta(policy.TableName) + ` ` + regexp.QuoteMeta(chain) + ` .*\bdport (\{ )?` + strconv.Itoa(port) + `\b`)
		start := time.Now()
		if _, err := api.Apply(jn.ctx, jn.store, []api.GlobalNetworkPolicy{joinPolicy(t, 0, port)}); err != nil {
			t.Fatalf("updating policy %s: %v", joinPolicyName(0), err)
		}
		err := m.await(re, 20*time.Second)
		return time.Since(start), err
	}
	// The monitor listens once nft has subscribed, which its start does
	// not tell: the first change is retried until one is seen.
	seen := false
	for try := 0; try < 5 && !seen; try++ {
		_, err := update(19000 + try)
		seen = err == nil
	}
	if !seen {
		t.Fatalf("nft monitor never showed a change of policy %s's chain %s", joinPolicyName(0), chain)
	}
	var lat []time.Duration
	for i := 0; i < policyUpdates; i++ {
		d, err := update(20000 + i)
		if err != nil {
			t.Fatalf("policy update %d: %v", i, err)
		}
		lat = append(lat, d)
	}
	return lat
}

// addPolicyUpdate adds the policy updates' p50 (target
// TargetPolicyUpdateMS) and p99.
func addPolicyUpdate(res *Results, lat []time.Duration) {
	res.Add(Series{Plot: PlotPolicyUpdate, Name: "p50", YLabel: "ms", Y: []float64{toMS(Percentile(lat, 50))}, Kind: Bars, Target: TargetPolicyUpdateMS})
	res.AddValue(PlotPolicyUpdate, "p99", "ms", toMS(Percentile(lat, 99)))
}

// startTimes are the moments of a daemon's start, from its exec.
type startTimes struct {
	// answering: /healthz first answers (the datastore, the embedded
	// member included, is open and the sockets are about to be served).
	answering time.Duration
	// serving: /healthz first answers ok: the sockets are served and the
	// policy is programmed.
	serving time.Duration
}

// startToServing stops the daemon p and times its start again, with the
// host's endpoints and policies in its datastore, from its exec until
// /healthz answers at all and until it answers ok (the tables stay
// across the restart, as in any upgrade, so programming them is a
// comparison with the kernel).
func startToServing(t *testing.T, h *harness.Host, p *harness.Process) startTimes {
	t.Helper()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}}
	// status is /healthz's HTTP status, 0 when it does not answer.
	status := func(ctx context.Context) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+benchMetricsAddr+"/healthz", nil)
		if err != nil {
			return 0
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if status(ctx) != http.StatusOK {
		t.Fatal("/healthz is not ok before the restart: the daemon's health would be measured, not its start")
	}
	chainsBefore := len(policyChains(t, h))
	if err := p.Stop(t); err != nil {
		t.Fatalf("stopping the daemon: %v", err)
	}
	began := time.Now()
	served := make(chan startTimes, 1)
	go func() {
		var st startTimes
		for ctx.Err() == nil {
			code := status(ctx)
			if code != 0 && st.answering == 0 {
				st.answering = time.Since(began)
			}
			if code == http.StatusOK {
				st.serving = time.Since(began)
				served <- st
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	p.Start(t)
	var st startTimes
	select {
	case st = <-served:
	case <-ctx.Done():
		t.Fatalf("/healthz not ok within 2 minutes of the restart:\n%s", p.LogTail(20))
	}
	if after := len(policyChains(t, h)); after != chainsBefore {
		t.Errorf("%d policy chains after the restart, %d before", after, chainsBefore)
	}
	return st
}

// addStart adds the start-to-serving time (target TargetStartS) and, as a
// figure without a target, when /healthz first answered.
func addStart(res *Results, st startTimes) {
	res.Add(Series{Plot: PlotStart, Name: "exec to /healthz ok", YLabel: "s", Y: []float64{st.serving.Seconds()}, Kind: Bars, Target: TargetStartS})
	res.AddValue(PlotStart, "exec to /healthz answering", "s", st.answering.Seconds())
}

// joinBench is the Join passes and what is measured with the host full:
//   - a second host, ref, is started and given refEndpoints endpoints
//     (removed when joinBench returns);
//   - pass 1: h filled with endpoints without policies (res.Joins), probe
//     Joins on h and ref in turns (res.JoinProbes), the daemon's RSS
//     (res.RSSLoadedKiB); h emptied;
//   - with rows, pass 2: JoinPolicies policies applied on both hosts, h
//     filled again (res.JoinsWithPolicies) and probed in turns with ref
//     again (res.JoinProbesWithPolicies); the daemon's RSS then; policy
//     updates timed to the kernel; the daemon restarted and timed to
//     serving; h emptied.
func joinBench(t *testing.T, fab *harness.Fabric, bin string, h *harness.Host, p *harness.Process, res *Results, rows bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	jn := newJoinNet(ctx, t, h)
	ref, _ := startBenchHost(t, fab, bin, "bench10")
	jr := newJoinNet(ctx, t, ref)
	defer func() {
		// Removed, and checked, before what the bench measures next.
		if !t.Failed() {
			jr.empty(t)
		}
	}()
	jr.fill(t, refEndpoints)
	n := joinCount(t)
	res.Joins = jn.fill(t, n)
	res.JoinProbes = interleavedProbes(t, jn, jr)
	res.RSSLoadedKiB = rssKiB(t, p.Pid())
	jn.empty(t)
	if !rows {
		return
	}

	jn.applyJoinPolicies(t)
	jr.applyJoinPolicies(t)
	res.JoinsWithPolicies = jn.fill(t, n)
	res.JoinProbesWithPolicies = interleavedProbes(t, jn, jr)
	requirePolicyChains(t, h)
	res.Add(Series{Plot: PlotMemory, Name: fmt.Sprintf("%d endpoints, %d policies", n, JoinPolicies), YLabel: "MiB", Y: []float64{float64(rssKiB(t, p.Pid())) / 1024}, Kind: Bars})

	lat := jn.policyUpdateBench(t)
	t.Logf("policy update to the kernel at %d endpoints, %d trials: p50 %s, p99 %s", n, len(lat), Percentile(lat, 50), Percentile(lat, 99))
	addPolicyUpdate(res, lat)

	st := startToServing(t, h, p)
	t.Logf("start to serving with %d endpoints and %d policies: %s (/healthz answering after %s)", n, JoinPolicies, st.serving.Round(time.Millisecond), st.answering.Round(time.Millisecond))
	addStart(res, st)
	requirePolicyChains(t, h)
	jn.empty(t)
}
