package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// bwImage is busybox with iperf3.
const bwImage = "iperf"

// bwLabelArgs are the docker run flags that limit a container.
func bwLabelArgs(ingress, egress string) []string {
	var out []string
	if ingress != "" {
		out = append(out, "--label", bandwidth.LabelPrefix+bandwidth.Ingress+"="+ingress)
	}
	if egress != "" {
		out = append(out, "--label", bandwidth.LabelPrefix+bandwidth.Egress+"="+egress)
	}
	return out
}

// bwServer imports the iperf image on both hosts, starts an iperf3 server
// container on hb and returns its address once ha routes to it.
func bwServer(tb testing.TB, ha, hb *bgpHost) string {
	tb.Helper()
	for _, h := range []*bgpHost{ha, hb} {
		h.ImportImage(tb, bwImage, "/usr/bin/iperf3")
	}
	hb.MustDocker(tb, "run", "-d", "--name", "srv", "--net", mhNetwork, bwImage, "iperf3", "-s")
	srvIP := containerIP(tb, hb, "srv")
	harness.Eventually(tb, 30*time.Second, 200*time.Millisecond, "route to the server's block on a", func() error {
		if !learnedRoute(blockOf26(net.ParseIP(srvIP)), hb.IP).MatchString(ha.MustExec(tb, "ip", "-4", "route")) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	return srvIP
}

func containerIP(tb testing.TB, h *bgpHost, name string) string {
	tb.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	return strings.TrimSpace(h.MustDocker(tb, "inspect", "-f", tmpl, name))
}

func containerEndpoint(tb testing.TB, h *bgpHost, name string) string {
	tb.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).EndpointID}}`, mhNetwork)
	return strings.TrimSpace(h.MustDocker(tb, "inspect", "-f", tmpl, name))
}

// iperfMedian is the median receiver rate (bit/s) of three short iperf3
// runs between container cli on h and the server (reverse: the server
// sends, i.e. traffic into cli). The first second (slow start, the full
// bucket) is left out.
func iperfMedian(tb testing.TB, h *bgpHost, cli, srvIP string, reverse bool) float64 {
	tb.Helper()
	args := []string{"exec", cli, "iperf3", "-c", srvIP, "-t", "4", "-O", "1", "-J"}
	if reverse {
		args = append(args, "-R")
	}
	var rates []float64
	for range 3 {
		out, err := h.Docker(tb, args...)
		rates = append(rates, iperfBPS(tb, out, err))
	}
	slices.Sort(rates)
	return rates[1]
}

// shapingOn lists the qdiscs (tc's lines) and ifb devices of h that the
// shaping of endpoints makes: tbf and ingress qdiscs on cali veths and
// ifb devices, and the ifb devices themselves.
func shapingOn(tb testing.TB, h *harness.Host) (qdiscs, ifbs []string) {
	tb.Helper()
	for _, line := range strings.Split(h.MustExec(tb, "tc", "qdisc", "show"), "\n") {
		if (strings.Contains(line, "qdisc tbf") || strings.Contains(line, "qdisc ingress")) &&
			(strings.Contains(line, "dev cali") || strings.Contains(line, "dev "+bandwidth.IfbPrefix)) {
			qdiscs = append(qdiscs, strings.TrimSpace(line))
		}
	}
	for _, line := range strings.Split(h.MustExec(tb, "ip", "-o", "link", "show", "type", "ifb"), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			ifbs = append(ifbs, strings.TrimSuffix(f[1], ":"))
		}
	}
	return qdiscs, ifbs
}

func within(got, want, tolerance float64) bool {
	return got >= want*(1-tolerance) && got <= want*(1+tolerance)
}

// TestBandwidthLimits (issue 22): a container labelled with ingress 50mbit
// and egress 20mbit gets those rates (within 10%, median of 3 iperf3 runs
// to a container on another host, each direction) while an unlimited
// container beside it keeps far more; `get endpoints -o wide` and /metrics
// show the limit; removing the container leaves no qdisc and no ifb
// device; a bad value fails docker run naming the label and leaves no
// veth, no qdisc, no endpoint and no address.
func TestBandwidthLimits(t *testing.T) {
	t.Parallel()
	harness.RequireFile(t, "/usr/bin/iperf3", "package iperf3")
	c := newBGPCluster(t)
	ha := c.addHostTB(t, "a", "--metrics-listen", "127.0.0.1:9091")
	hb := c.addHost(t, "b")
	srvIP := bwServer(t, ha, hb)

	ha.MustDocker(t, append(append([]string{"run", "-d", "--name", "lim", "--net", mhNetwork}, bwLabelArgs("50mbit", "20mbit")...), bwImage, "sleep", "3600")...)
	ha.MustDocker(t, "run", "-d", "--name", "free", "--net", mhNetwork, bwImage, "sleep", "3600")
	ep := containerEndpoint(t, ha, "lim")
	veth, ifb := "cali"+ep[:11], bandwidth.IfbName(ep)

	// In place when docker run returns (Join applied it).
	qdiscs, ifbs := shapingOn(t, ha.Host)
	joined := strings.Join(qdiscs, "\n")
	for _, re := range []string{
		`qdisc tbf 1: dev ` + veth + ` root .*rate 50Mbit`,
		`qdisc ingress ffff: dev ` + veth + ` `,
		`qdisc tbf 1: dev ` + ifb + ` root .*rate 20Mbit`,
	} {
		if !regexp.MustCompile(re).MatchString(joined) {
			t.Errorf("no qdisc matching %q on host a:\n%s", re, joined)
		}
	}
	if !slices.Equal(ifbs, []string{ifb}) {
		t.Errorf("ifb devices %v, want [%s]", ifbs, ifb)
	}
	if out := c.mustCtl(t, "get", "endpoints", "-o", "wide"); !strings.Contains(out, "ingress 50mbit, egress 20mbit") {
		t.Errorf("get endpoints -o wide does not show the limits:\n%s", out)
	}

	const tolerance = 0.10
	egress := iperfMedian(t, ha, "lim", srvIP, false)
	ingress := iperfMedian(t, ha, "lim", srvIP, true)
	freeOut := iperfMedian(t, ha, "free", srvIP, false)
	freeIn := iperfMedian(t, ha, "free", srvIP, true)
	t.Logf("limited container: egress %.1f Mbit/s (limit 20), ingress %.1f Mbit/s (limit 50); unlimited: egress %.0f Mbit/s, ingress %.0f Mbit/s",
		egress/1e6, ingress/1e6, freeOut/1e6, freeIn/1e6)
	if !within(egress, 20e6, tolerance) {
		t.Errorf("egress %.2f Mbit/s is not within 10%% of 20 Mbit/s", egress/1e6)
	}
	if !within(ingress, 50e6, tolerance) {
		t.Errorf("ingress %.2f Mbit/s is not within 10%% of 50 Mbit/s", ingress/1e6)
	}
	// Clearly above the limits: four times the larger one.
	if freeOut < 200e6 || freeIn < 200e6 {
		t.Errorf("the unlimited container got egress %.0f, ingress %.0f Mbit/s: want far above the limits (>= 200)", freeOut/1e6, freeIn/1e6)
	}

	metrics := ha.MustExec(t, "curl", "-sS", "-m", "5", "http://127.0.0.1:9091/metrics")
	for _, dir := range []string{bandwidth.DirIngress, bandwidth.DirEgress} {
		re := regexp.MustCompile(`(?m)^calico_cnm_bandwidth_shaped_bytes_total\{direction="` + dir + `",endpoint="` + ep[:12] + `"\} ([0-9.e+]+)$`)
		m := re.FindStringSubmatch(metrics)
		if m == nil || m[1] == "0" {
			t.Errorf("/metrics has no shaped bytes for %s of the limited endpoint:\n%s", dir, grepLines(metrics, "bandwidth"))
		}
	}
	if !strings.Contains(metrics, `calico_cnm_bandwidth_dropped_packets_total{direction="egress",endpoint="`+ep[:12]+`"}`) {
		t.Errorf("/metrics has no drop counter of the limited endpoint:\n%s", grepLines(metrics, "bandwidth"))
	}

	ha.MustDocker(t, "rm", "-f", "lim")
	if qdiscs, ifbs := shapingOn(t, ha.Host); len(qdiscs) != 0 || len(ifbs) != 0 {
		t.Errorf("after docker rm: qdiscs %q, ifb devices %q left", qdiscs, ifbs)
	}

	// A bad value: docker run fails naming the label; nothing is left.
	links := func() int { return strings.Count(ha.MustExec(t, "ip", "-o", "link", "show"), ": cali") }
	vethsBefore, usedBefore, epsBefore := links(), ipamUsed(t, c), len(endpointIDs(t, c))
	for _, v := range []string{"50 mbits", "-1", "999bit", "101gbit"} {
		out, err := ha.Docker(t, append(append([]string{"run", "-d", "--name", "bad", "--net", mhNetwork}, bwLabelArgs(v, "")...), bwImage, "sleep", "3600")...)
		want := fmt.Sprintf(`bandwidth label %singress=%q`, bandwidth.LabelPrefix, v)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("docker run with ingress %q: %v %s; want an error naming %s", v, err, out, want)
		}
		ha.MustDocker(t, "rm", "-f", "bad")
	}
	if n := links(); n != vethsBefore {
		t.Errorf("%d cali veths after the failed runs, %d before", n, vethsBefore)
	}
	if qdiscs, ifbs := shapingOn(t, ha.Host); len(qdiscs) != 0 || len(ifbs) != 0 {
		t.Errorf("after the failed runs: qdiscs %q, ifb devices %q", qdiscs, ifbs)
	}
	if used := ipamUsed(t, c); used != usedBefore {
		t.Errorf("%d addresses assigned after the failed runs, %d before", used, usedBefore)
	}
	if n := len(endpointIDs(t, c)); n != epsBefore {
		t.Errorf("%d endpoint records after the failed runs, %d before", n, epsBefore)
	}
}

// ipamUsed is the number of assigned addresses (ipam show).
func ipamUsed(t *testing.T, c *bgpCluster) int {
	t.Helper()
	var blocks []struct{ Used int }
	if err := json.Unmarshal([]byte(c.mustCtl(t, "ipam", "show", "-o", "json")), &blocks); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range blocks {
		n += b.Used
	}
	return n
}

// endpointIDs are the endpoint records of every node (get endpoints).
func endpointIDs(t *testing.T, c *bgpCluster) []string {
	t.Helper()
	var eps []struct{ ID string }
	if err := json.Unmarshal([]byte(c.mustCtl(t, "get", "endpoints", "-o", "json")), &eps); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range eps {
		out = append(out, e.ID)
	}
	return out
}

// TestReadmeBandwidth pastes the README's bandwidth block on one host
// whose daemon runs with its defaults (embedded etcd), in a directory where
// ./bin/calico-cnm is the daemon's binary, as in the checkout after `make
// run`.
func TestReadmeBandwidth(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, "readme-bw", harness.HostOptions{})
	h.ImportBusybox(t)
	h.MustDocker(t, "tag", harness.Image, "busybox")
	h.StartPlugin(t, bin, nil)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin", "calico-cnm")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+h.NetnsPath, "--", "sh", "-ex", "-c", readmeBlock(t, "bandwidth"))
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir, "DOCKER_HOST=" + h.DockerHost(), "DOCKER_CONFIG=" + dir}
	out, err := cmd.CombinedOutput()
	text := string(out)
	t.Logf("output:\n%s", text)
	if err != nil {
		t.Fatalf("pasted commands failed: %v", err)
	}
	requireOutput(t, text, "ingress 50mbit, egress 20mbit", "network bwnet: bandwidth defaults egress 10mbit", "ingress 50mbit, egress 10mbit")
	for _, re := range []string{`qdisc tbf 1: dev cali[0-9a-f]{11} root .*rate 50Mbit`, `qdisc tbf 1: dev ` + bandwidth.IfbPrefix + `[0-9a-f]{11} root .*rate 20Mbit`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("output lacks a line matching %s", re)
		}
	}
	if qdiscs, ifbs := shapingOn(t, h); len(qdiscs) != 0 || len(ifbs) != 0 {
		t.Errorf("after docker rm: qdiscs %q, ifb devices %q left", qdiscs, ifbs)
	}
}

// TestBandwidthRestartAndCrash: the shaping follows a change of the
// network's default (calico-cnm network bandwidth), a restarted daemon
// rebuilds shaping that went missing from the endpoint record, and a
// container removed while the daemon was down leaves no ifb device or
// qdisc once the daemon is back.
func TestBandwidthRestartAndCrash(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, "bw-restart", harness.HostOptions{})
	h.ImportBusybox(t)
	p := h.StartPlugin(t, bin, nil, append(h.ServeArgs(nil), "--resync-interval", "2s", "--reconcile-grace", "1s")...)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
		}
	})
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16",
		"-o", bandwidth.NetworkOptionPrefix+bandwidth.Egress+"=20mbit", mhNetwork)
	h.MustDocker(t, append(append([]string{"run", "-d", "--name", "lim", "--net", mhNetwork}, bwLabelArgs("50mbit", "")...), harness.Image, "sleep", "3600")...)
	ep := strings.TrimSpace(h.MustDocker(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).EndpointID}}`, mhNetwork), "lim"))
	veth, ifb := "cali"+ep[:11], bandwidth.IfbName(ep)
	wantShaping := func(what string, res ...string) {
		t.Helper()
		harness.Eventually(t, 30*time.Second, 200*time.Millisecond, what, func() error {
			qdiscs, _ := shapingOn(t, h)
			text := strings.Join(qdiscs, "\n")
			for _, re := range res {
				if !regexp.MustCompile(re).MatchString(text) {
					return fmt.Errorf("no qdisc matching %q:\n%s", re, text)
				}
			}
			return nil
		})
	}
	ingress50 := `qdisc tbf 1: dev ` + veth + ` root .*rate 50Mbit`
	wantShaping("shaping at Join", ingress50, `qdisc tbf 1: dev `+ifb+` root .*rate 20Mbit`)

	// The network's default changes: the endpoint's egress follows, its
	// own ingress label stays.
	if out := h.MustExec(t, bin, "network", "bandwidth", mhNetwork, "--egress", "10mbit"); !strings.Contains(out, "egress 10mbit") {
		t.Fatalf("network bandwidth: %s", out)
	}
	wantShaping("the new default applied", ingress50, `qdisc tbf 1: dev `+ifb+` root .*rate 10Mbit`)

	// The daemon is down while the shaping goes missing: it is rebuilt
	// from the endpoint record.
	p.Kill9(t)
	h.MustExec(t, "tc", "qdisc", "del", "dev", veth, "root")
	h.MustExec(t, "ip", "link", "del", ifb)
	p.Start(t)
	wantShaping("shaping rebuilt after the restart", ingress50, `qdisc tbf 1: dev `+ifb+` root .*rate 10Mbit`)

	// The container goes while the daemon is down (Docker's Leave
	// fails): once the daemon is back, nothing of its shaping is left.
	p.Kill9(t)
	if _, err := h.Docker(t, "rm", "-f", "lim"); err != nil {
		t.Logf("docker rm while the plugin is down: %v", err)
	}
	if _, ifbs := shapingOn(t, h); !slices.Contains(ifbs, ifb) {
		t.Fatalf("the ifb device went with the container while the daemon was down (ifb devices: %v): nothing left to test", ifbs)
	}
	p.Start(t)
	harness.Eventually(t, 60*time.Second, 500*time.Millisecond, "no shaping left after the crash", func() error {
		if qdiscs, ifbs := shapingOn(t, h); len(qdiscs) != 0 || len(ifbs) != 0 {
			return fmt.Errorf("qdiscs %q, ifb devices %q", qdiscs, ifbs)
		}
		return nil
	})
}
