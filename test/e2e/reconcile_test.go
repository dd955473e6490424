package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

const reconcileMetricsAddr = "127.0.0.1:9091"

// newReconcileHost is newCalicoHost with metrics on and a short reconcile
// grace period (the default, 20 s, only makes the test slower).
func newReconcileHost(t *testing.T, name string) *calicoHost {
	t.Helper()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, name, harness.HostOptions{})
	h.ImportBusybox(t)
	args := append(h.ServeArgs(nil), "--metrics-listen", reconcileMetricsAddr, "--reconcile-grace", "5s")
	p := h.StartPlugin(t, bin, nil, args...)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 120)
		}
	})
	return &calicoHost{Host: h, bin: bin, plugin: p}
}

// httpGet fetches a URL from inside the host's netns (where the metrics
// listener's loopback is).
func (h *calicoHost) httpGet(t *testing.T, path string) (string, error) {
	t.Helper()
	return h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+reconcileMetricsAddr+path)
}

// metricValue reads one sample (exact name with labels) from /metrics.
func (h *calicoHost) metricValue(t *testing.T, sample string) string {
	t.Helper()
	out, err := h.httpGet(t, "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("/metrics has no sample %s", sample)
	}
	return m[1]
}

func (h *calicoHost) endpointKeys(t *testing.T) []string {
	t.Helper()
	out := h.MustExec(t, "etcdctl", "--endpoints", "http://127.0.0.1:2379", "get", "--prefix", "--keys-only", "/calico-cnm/v1/endpoints/")
	var keys []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			keys = append(keys, l)
		}
	}
	return keys
}

func hostRouteRE(ip net.IP) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip.String()) + ` dev (cali[0-9a-f]{11}) proto 80 scope link`)
}

// TestReconcileAfterCrash: the daemon is SIGKILLed; while it is down a
// container is removed (Docker cannot tell us), a host route is deleted by
// hand and a detached veth pair appears (what a Join that died half way
// leaves). After the restart the reconcile loop must give the removed
// container's address back and remove its veth, route and record, restore
// the deleted route, delete the detached pair, release an address that
// Docker requested but never used, and leave the running containers (and a
// foreign cali* veth) alone.
func TestReconcileAfterCrash(t *testing.T) {
	t.Parallel()
	h := newReconcileHost(t, "reconcile")
	d := func(args ...string) string { return h.MustDocker(t, args...) }

	d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net1")
	for _, c := range []string{"c1", "c2", "c3"} {
		d("run", "-d", "--name", c, "--net", "net1", harness.Image, "sleep", "3600")
	}
	ip1, ip2, ip3 := h.containerIP(t, "c1", "net1"), h.containerIP(t, "c2", "net1"), h.containerIP(t, "c3", "net1")
	t.Logf("c1=%s c2=%s c3=%s", ip1, ip2, ip3)
	if out, err := h.Docker(t, "exec", "c1", "ping", "-c", "1", "-W", "2", ip3.String()); err != nil {
		t.Fatalf("c1 cannot ping c3 before the crash: %v\n%s", err, out)
	}
	if out, err := h.httpGet(t, "/healthz"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("/healthz of a healthy daemon: %v %q", err, out)
	}
	// serve's Go runtime settings (the harness sets neither GOGC nor
	// GOMEMLIMIT): the collector's target and the soft memory limit.
	for sample, want := range map[string]string{"go_gc_gogc_percent": "40", "go_gc_gomemlimit_bytes": "4.194304e+07"} {
		if got := h.metricValue(t, sample); got != want {
			t.Errorf("%s = %s, want %s", sample, got, want)
		}
	}
	if n := len(h.endpointKeys(t)); n != 3 {
		t.Fatalf("%d endpoint records, want 3", n)
	}
	routes := h.hostRoutes(t, "-4")
	m2, m3 := hostRouteRE(ip2).FindStringSubmatch(routes), hostRouteRE(ip3).FindStringSubmatch(routes)
	if m2 == nil || m3 == nil {
		t.Fatalf("missing host routes for c2/c3:\n%s", routes)
	}
	veth2, veth3 := m2[1], m3[1]

	h.plugin.Kill9(t)
	if _, err := h.httpGet(t, "/healthz"); err == nil {
		t.Error("/healthz answered with the daemon dead")
	}
	h.MustExec(t, "ip", "route", "del", ip3.String()+"/32", "dev", veth3)
	h.MustExec(t, "ip", "link", "add", "cali0123456789a", "type", "veth", "peer", "name", "tmp0123456789a")
	// Not ours: its peer is not tmp<same id> (think of a Calico CNI pod).
	h.MustExec(t, "ip", "link", "add", "calif0f0f0f0f0f", "type", "veth", "peer", "name", "foreign0")

	// dockerd 20.10 retries each plugin call for ~15 s (backoff 1+2+4+8 s),
	// then logs a warning and carries on: RevokeExternalConnectivity, Leave,
	// DeleteEndpoint and ReleaseAddress all fail, and rm still succeeds
	// after about a minute.
	start := time.Now()
	out, err := h.Docker(t, "rm", "-f", "c2")
	took := time.Since(start)
	t.Logf("docker rm -f c2 with the plugin down took %s", took.Round(time.Second))
	if err != nil {
		t.Fatalf("docker rm -f with the plugin down failed: %v (%s)", err, out)
	}
	if ps := d("ps", "-a", "--format", "{{.Names}}"); strings.Contains(ps, "c2") {
		t.Fatalf("c2 still listed after rm: %s", ps)
	}
	if insp := d("network", "inspect", "-f", "{{range .Containers}}{{.Name}} {{end}}", "net1"); strings.Contains(insp, "c2") {
		t.Fatalf("Docker still has c2's endpoint: %s", insp)
	}
	// Without Leave, Docker moves the container side back into the host
	// namespace when it destroys the sandbox: the veth pair survives.
	leftover := false
	for _, l := range h.caliLinks(t) {
		leftover = leftover || l == veth2
	}
	t.Logf("c2's veth %s left in the host after docker rm: %v", veth2, leftover)

	h.plugin.Restart(t)
	// An address Docker asks for but never gets to use (as when dockerd
	// dies between RequestAddress and CreateEndpoint).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var orphan struct{ Address string }
	if err := harness.PluginCall(ctx, filepath.Join(h.PluginDir, harness.IpamSocket), "/IpamDriver.RequestAddress",
		map[string]any{"PoolID": "192.168.0.0/16"}, &orphan); err != nil {
		t.Fatalf("RequestAddress: %v", err)
	}
	t.Logf("orphan address %s", orphan.Address)

	harness.Eventually(t, 15*time.Second, 200*time.Millisecond, "c3's deleted route restored", func() error {
		if m := hostRouteRE(ip3).FindStringSubmatch(h.hostRoutes(t, "-4")); m == nil || m[1] != veth3 {
			return fmt.Errorf("no route %s dev %s", ip3, veth3)
		}
		return nil
	})
	harness.Eventually(t, 60*time.Second, 500*time.Millisecond, "c2's endpoint and the orphan address cleaned up", func() error {
		if n := h.usedIPs(t); n != 2 {
			return fmt.Errorf("%d addresses allocated, want 2", n)
		}
		if keys := h.endpointKeys(t); len(keys) != 2 {
			return fmt.Errorf("endpoint records: %v", keys)
		}
		return nil
	})
	if hostRouteRE(ip2).MatchString(h.hostRoutes(t, "-4")) {
		t.Errorf("route to removed c2 (%s) still there:\n%s", ip2, h.hostRoutes(t, "-4"))
	}
	harness.Eventually(t, 15*time.Second, 500*time.Millisecond, "the detached veth pair removed", func() error {
		for _, l := range h.caliLinks(t) {
			if l == "cali0123456789a" {
				return fmt.Errorf("cali0123456789a still there")
			}
		}
		return nil
	})
	links, want := h.caliLinks(t), []string{vethOf(t, h, ip1), veth3, "calif0f0f0f0f0f"}
	sort.Strings(links)
	sort.Strings(want)
	if !reflect.DeepEqual(links, want) {
		t.Errorf("cali veths after the reconcile: %v, want %v (c1's, c3's and the foreign one)", links, want)
	}
	if links := h.MustExec(t, "ip", "-o", "link", "show"); strings.Contains(links, "tmp"+veth2[len("cali"):]) || strings.Contains(links, "tmp0123456789a") {
		t.Errorf("c2's container-side veth still in the host:\n%s", links)
	}

	// The running containers kept their addresses, routes and veths.
	if got := h.containerIP(t, "c1", "net1"); !got.Equal(ip1) {
		t.Errorf("c1's address changed: %s -> %s", ip1, got)
	}
	if got := h.containerIP(t, "c3", "net1"); !got.Equal(ip3) {
		t.Errorf("c3's address changed: %s -> %s", ip3, got)
	}
	routes = h.hostRoutes(t, "-4")
	for _, ip := range []net.IP{ip1, ip3} {
		if !hostRouteRE(ip).MatchString(routes) {
			t.Errorf("no host route for running container %s:\n%s", ip, routes)
		}
	}
	if out, err := h.Docker(t, "exec", "c1", "ping", "-c", "2", "-W", "2", ip3.String()); err != nil {
		t.Errorf("c1 cannot ping c3 after the reconcile: %v\n%s", err, out)
	}
	if out, err := h.Docker(t, "exec", "c3", "ping", "-c", "2", "-W", "2", ip1.String()); err != nil {
		t.Errorf("c3 cannot ping c1 after the reconcile: %v\n%s", err, out)
	}

	if out, err := h.cli(t, "ipam", "check"); err != nil {
		t.Errorf("ipam check after the reconcile: %v\n%s", err, out)
	} else if !strings.Contains(out, "leaked addresses:     0") {
		t.Errorf("ipam check output:\n%s", out)
	}

	// Every fix was counted (counters restart with the process).
	for sample, want := range map[string]string{
		`calico_cnm_reconcile_fixes_total{kind="endpoint_removed"}`:  "1",
		`calico_cnm_reconcile_fixes_total{kind="address_released"}`:  "1",
		`calico_cnm_reconcile_fixes_total{kind="route_restored"}`:    "1",
		`calico_cnm_reconcile_fixes_total{kind="orphan_released"}`:   "1",
		`calico_cnm_reconcile_fixes_total{kind="interface_removed"}`: "1",
	} {
		if got := h.metricValue(t, sample); got != want {
			t.Errorf("%s = %s, want %s", sample, got, want)
		}
	}
	if out, err := h.httpGet(t, "/healthz"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Errorf("/healthz after the restart: %v %q", err, out)
	}
	for _, l := range strings.Split(h.plugin.Log(), "\n") {
		if strings.Contains(l, "reconcile:") {
			t.Logf("plugin: %s", l)
		}
	}
	for _, s := range []string{"removed an endpoint Docker no longer has", "restored a missing host route"} {
		if !h.plugin.LogContains(s) {
			t.Errorf("plugin log lacks %q", s)
		}
	}

	// The released address is really free: a new container can take it.
	d("run", "-d", "--name", "c4", "--net", "net1", "--ip", ip2.String(), harness.Image, "sleep", "3600")
	if got := h.containerIP(t, "c4", "net1"); !got.Equal(ip2) {
		t.Errorf("c4 asked for %s, got %s", ip2, got)
	}
	// The daemon follows Docker's events (API 1.41 filters): c4's network
	// connect reached it (logged at debug level, which the harness uses).
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "Docker's connect event seen", func() error {
		for _, l := range strings.Split(h.plugin.Log(), "\n") {
			if strings.Contains(l, `msg="Docker event"`) && strings.Contains(l, "action=connect") {
				return nil
			}
		}
		return fmt.Errorf("no connect event in the plugin log")
	})
}

// vethOf is the host-side veth of the container with address ip.
func vethOf(t *testing.T, h *calicoHost, ip net.IP) string {
	t.Helper()
	m := hostRouteRE(ip).FindStringSubmatch(h.hostRoutes(t, "-4"))
	if m == nil {
		t.Fatalf("no host route for %s", ip)
	}
	return m[1]
}
