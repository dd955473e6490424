package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// The multi-host tests: netns Docker hosts on one fabric, one etcd in the
// root namespace, each host with its own calico-cnm (BGP on). Pool
// 192.168.0.0/16 (/26 blocks), network net1 created with the same subnet on
// every host (Docker networks are per dockerd).

const (
	mhPool    = "192.168.0.0/16"
	mhNetwork = "net1"
)

// bgpCluster is the fabric, the shared etcd and the hosts.
type bgpCluster struct {
	fabric *harness.Fabric
	etcd   string
	bin    string
	hosts  []*bgpHost
}

type bgpHost struct {
	*harness.Host
	c      *bgpCluster
	plugin *harness.Process
}

func newBGPCluster(t *testing.T) *bgpCluster {
	t.Helper()
	harness.RequirePrereqs(t)
	c := &bgpCluster{bin: harness.BuildBinary(t), fabric: harness.NewFabric(t, "")}
	c.etcd = c.fabric.StartEtcd(t)
	if out, err := c.ctl(t, "pool", "add", mhPool); err != nil {
		t.Fatalf("pool add: %v\n%s", err, out)
	}
	return c
}

// ctl runs the operator CLI from the root namespace against the shared etcd.
func (c *bgpCluster) ctl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return mhRun(ctx, append([]string{c.bin}, append(args, "--etcd-endpoints", c.etcd)...)...)
}

func (c *bgpCluster) mustCtl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.ctl(t, args...)
	if err != nil {
		t.Fatalf("calico-cnm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// addHost starts a Docker host with calico-cnm (BGP on, short grace and
// resync so that withdrawals show within seconds) and creates net1 on it.
func (c *bgpCluster) addHost(t *testing.T, name string) *bgpHost {
	t.Helper()
	return c.addHostTB(t, name)
}

// addHostTB is addHost for tests and benchmarks; extra flags are appended
// to the daemon's (a later flag wins).
func (c *bgpCluster) addHostTB(tb testing.TB, name string, extra ...string) *bgpHost {
	tb.Helper()
	return c.addHostOn(tb, c.fabric, name, append([]string{"--bgp"}, extra...)...)
}

// addHostOn is addHostTB on any fabric, BGP off unless extra has --bgp.
func (c *bgpCluster) addHostOn(tb testing.TB, f *harness.Fabric, name string, extra ...string) *bgpHost {
	tb.Helper()
	h := &bgpHost{Host: f.AddHost(tb, name, harness.HostOptions{}), c: c}
	h.ImportBusybox(tb)
	env := []string{"ETCD_ENDPOINTS=" + c.etcd}
	args := append(h.ServeArgs(env), "--block-release-grace", "1s", "--resync-interval", "2s", "--bgp-sync-timeout", "20s")
	h.plugin = h.StartPlugin(tb, c.bin, env, append(args, extra...)...)
	tb.Cleanup(func() {
		if tb.Failed() {
			h.DumpLogs(tb, 60)
		}
	})
	h.MustDocker(tb, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", mhPool, mhNetwork)
	c.hosts = append(c.hosts, h)
	return h
}

// run starts a container on net1 and returns its address.
func (h *bgpHost) run(t *testing.T, name string) net.IP {
	t.Helper()
	h.MustDocker(t, "run", "-d", "--name", name, "--net", mhNetwork, harness.Image, "sleep", "3600")
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	ip := net.ParseIP(strings.TrimSpace(h.MustDocker(t, "inspect", "-f", tmpl, name)))
	if ip == nil {
		t.Fatalf("%s: container %s has no address", h.Name, name)
	}
	return ip
}

// status is `calico-cnm node status -o json` on this host.
func (h *bgpHost) status(t testing.TB) (routing.Status, error) {
	t.Helper()
	out, err := mhRun(context.Background(), h.c.bin, "node", "status", "-o", "json", "--state-dir", h.StateDir)
	if err != nil {
		return routing.Status{}, fmt.Errorf("node status on %s: %v: %s", h.Name, err, out)
	}
	var st routing.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return routing.Status{}, fmt.Errorf("node status -o json on %s: %v\n%s", h.Name, err, out)
	}
	return st, nil
}

// learnedRoute matches "<dst> via <gw> dev eth0 proto 81" in `ip route`.
func learnedRoute(dst string, gw net.IP) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(dst) + ` via ` + regexp.QuoteMeta(gw.String()) + ` dev eth0 proto 81\b`)
}

func (h *bgpHost) routes(t *testing.T) string {
	t.Helper()
	return h.MustExec(t, "ip", "-4", "route", "show")
}

// waitRoute waits until host h has dst via gw (present) or has no route
// for dst at all (!present).
func (h *bgpHost) waitRoute(t *testing.T, dst string, gw net.IP, present bool, timeout time.Duration) {
	t.Helper()
	what := fmt.Sprintf("%s: route %s via %s present=%v", h.Name, dst, gw, present)
	harness.Eventually(t, timeout, 100*time.Millisecond, what, func() error {
		r := h.routes(t)
		has := learnedRoute(dst, gw).MatchString(r)
		if present && !has {
			return fmt.Errorf("not yet:\n%s", r)
		}
		if !present && regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(dst)+` `).MatchString(r) {
			return fmt.Errorf("still there:\n%s", r)
		}
		return nil
	})
}

// waitPeers waits until h has exactly the given peers (address -> type),
// all Established.
func (h *bgpHost) waitPeers(t testing.TB, want map[string]routing.PeerType, timeout time.Duration) routing.Status {
	t.Helper()
	var st routing.Status
	harness.Eventually(t, timeout, 250*time.Millisecond, h.Name+": BGP sessions established", func() error {
		var err error
		if st, err = h.status(t); err != nil {
			return err
		}
		if len(st.Peers) != len(want) {
			return fmt.Errorf("%d peers, want %d: %+v", len(st.Peers), len(want), st.Peers)
		}
		for _, p := range st.Peers {
			typ, ok := want[p.Address]
			if !ok || typ != p.Type || p.State != "Established" {
				return fmt.Errorf("peer %s type %s state %s; want %v", p.Address, p.Type, p.State, want)
			}
		}
		return nil
	})
	return st
}

// waitPeerDown waits until h reports its session to addr as not
// Established.
func (h *bgpHost) waitPeerDown(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, 100*time.Millisecond, h.Name+": session to "+addr+" down", func() error {
		st, err := h.status(t)
		if err != nil {
			return err
		}
		for _, p := range st.Peers {
			if p.Address == addr && p.State == "Established" {
				return fmt.Errorf("still Established")
			}
		}
		return nil
	})
}

func (h *bgpHost) ping(t *testing.T, from string, to net.IP) {
	t.Helper()
	// The first packet may wait for ARP on the fabric; allow a few tries.
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, fmt.Sprintf("%s: %s pings %s", h.Name, from, to), func() error {
		out, err := h.Docker(t, "exec", from, "ping", "-c", "1", "-W", "1", to.String())
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

func blockOf26(ip net.IP) string {
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(26, 32)), Mask: net.CIDRMask(26, 32)}).String()
}

// pingStats runs `ping -i 0.2 -w secs` in container from and returns the
// transmitted and received counts.
func pingStats(ctx context.Context, h *bgpHost, from string, to net.IP, secs int) (tx, rx int, out string, err error) {
	out, err = h.DockerCtx(ctx, "exec", from, "ping", "-i", "0.2", "-w", strconv.Itoa(secs), "-q", to.String())
	m := pingStatistics.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, out, fmt.Errorf("no ping summary (%v): %s", err, out)
	}
	tx, _ = strconv.Atoi(m[1])
	rx, _ = strconv.Atoi(m[2])
	return tx, rx, out, nil
}

// TestMultiHostMesh: three hosts in a full mesh, then a fourth joining, a
// withdrawal, and a kill -9 restart under graceful restart.
func TestMultiHostMesh(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	runMultiHost(t, c, false)
}

// TestMultiHostRouteReflectors: the same story with the mesh off, hosts a
// and c route reflectors (one cluster id) and b and d their clients.
func TestMultiHostRouteReflectors(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	c.mustCtl(t, "bgp", "config", "--mesh", "off")
	for _, n := range []string{"a", "c"} {
		c.mustCtl(t, "bgp", "config", "--node", n, "--route-reflector=true", "--cluster-id", "1.0.0.1")
	}
	runMultiHost(t, c, true)
}

func runMultiHost(t *testing.T, c *bgpCluster, rr bool) {
	a, b, hc := c.addHost(t, "a"), c.addHost(t, "b"), c.addHost(t, "c")
	ipA, ipB, ipC := a.run(t, "a1"), b.run(t, "b1"), hc.run(t, "c1")
	t.Logf("a1=%s b1=%s c1=%s", ipA, ipB, ipC)
	blkA, blkB, blkC := blockOf26(ipA), blockOf26(ipB), blockOf26(ipC)
	if blkA == blkB || blkB == blkC || blkA == blkC {
		t.Fatalf("hosts share a block: %s %s %s", blkA, blkB, blkC)
	}

	expectPeers := func(h *bgpHost, others ...*bgpHost) map[string]routing.PeerType {
		want := map[string]routing.PeerType{}
		for _, o := range others {
			switch {
			case !rr:
				want[o.IP.String()] = routing.PeerMesh
			case h.Name == "a" || h.Name == "c":
				if o.Name == "a" || o.Name == "c" {
					want[o.IP.String()] = routing.PeerReflector
				} else {
					want[o.IP.String()] = routing.PeerRRClient
				}
			case o.Name == "a" || o.Name == "c":
				want[o.IP.String()] = routing.PeerReflector
			}
		}
		return want
	}

	start := time.Now()
	a.waitRoute(t, blkB, b.IP, true, 30*time.Second)
	a.waitRoute(t, blkC, hc.IP, true, 30*time.Second)
	b.waitRoute(t, blkA, a.IP, true, 30*time.Second)
	b.waitRoute(t, blkC, hc.IP, true, 30*time.Second)
	hc.waitRoute(t, blkA, a.IP, true, 30*time.Second)
	hc.waitRoute(t, blkB, b.IP, true, 30*time.Second)
	t.Logf("all blocks routed everywhere %s after the last container started", time.Since(start).Round(time.Millisecond))
	t.Logf("a's routes:\n%s", a.routes(t))

	t.Run("pings across hosts", func(t *testing.T) {
		a.ping(t, "a1", ipB)
		a.ping(t, "a1", ipC)
		hc.ping(t, "c1", ipB)
	})

	t.Run("node status", func(t *testing.T) {
		st := a.waitPeers(t, expectPeers(a, b, hc), 30*time.Second)
		if st.Node != "a" || st.Address != a.IP.String() || st.ASN != routing.DefaultASN {
			t.Errorf("status identity = %s %s AS %d", st.Node, st.Address, st.ASN)
		}
		if !mhContains(st.Advertised, blkA) {
			t.Errorf("a advertises %v, want %s among them", st.Advertised, blkA)
		}
		for _, p := range st.Peers {
			if p.Uptime == "" || p.Advertised < 1 {
				t.Errorf("peer %s: uptime %q advertised %d", p.Address, p.Uptime, p.Advertised)
			}
		}
		b.waitPeers(t, expectPeers(b, a, hc), 30*time.Second)
		out, err := mhRun(context.Background(), c.bin, "node", "status", "--state-dir", a.StateDir)
		if err != nil || !strings.Contains(out, "Established") || !strings.Contains(out, b.IP.String()) {
			t.Errorf("node status table: %v\n%s", err, out)
		}
		t.Logf("node status on a:\n%s", out)
	})

	t.Run("emptied block is withdrawn everywhere", func(t *testing.T) {
		b.MustDocker(t, "rm", "-f", "b1")
		a.waitRoute(t, blkB, b.IP, false, 30*time.Second)
		hc.waitRoute(t, blkB, b.IP, false, 30*time.Second)
		if r := b.routes(t); strings.Contains(r, "blackhole "+blkB) {
			t.Errorf("b still has the blackhole of its released block:\n%s", r)
		}
	})

	ipB2 := b.run(t, "b2")
	blkB2 := blockOf26(ipB2)
	a.waitRoute(t, blkB2, b.IP, true, 30*time.Second)
	hc.waitRoute(t, blkB2, b.IP, true, 30*time.Second)

	// d belongs to the whole test (its cleanup must not run when the
	// subtest ends), so it is created with the parent's t.
	parent := t
	t.Run("a fourth host joins", func(t *testing.T) {
		d := c.addHost(parent, "d")
		ipD := d.run(t, "d1")
		blkD := blockOf26(ipD)
		for _, h := range []*bgpHost{a, b, hc} {
			h.waitRoute(t, blkD, d.IP, true, 30*time.Second)
		}
		d.waitRoute(t, blkA, a.IP, true, 30*time.Second)
		a.ping(t, "a1", ipD)
		d.ping(t, "d1", ipB2)
		d.waitPeers(t, expectPeers(d, a, b, hc), 30*time.Second)
		a.waitPeers(t, expectPeers(a, b, hc, d), 30*time.Second)
	})

	t.Run("kill -9 of b's daemon keeps b reachable (graceful restart)", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		type result struct {
			tx, rx int
			out    string
			err    error
			ran    time.Duration
		}
		var fromA, fromC result
		const pingSecs = 14
		for _, p := range []struct {
			h    *bgpHost
			from string
			res  *result
		}{{a, "a1", &fromA}, {hc, "c1", &fromC}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				p.res.tx, p.res.rx, p.res.out, p.res.err = pingStats(ctx, p.h, p.from, ipB2, pingSecs)
				p.res.ran = time.Since(began)
			}()
		}
		time.Sleep(2 * time.Second)
		b.plugin.Kill9(t)
		killed := time.Now()
		// The status is written at the end of the pass that programs the
		// kernel: once a and c report b's session down, the pass that
		// could have dropped b's routes is over.
		for _, h := range []*bgpHost{a, hc} {
			h.waitPeerDown(t, b.IP.String(), 30*time.Second)
		}
		// During the restart window: everyone keeps b's route, b keeps its own.
		for _, h := range []*bgpHost{a, hc} {
			if !learnedRoute(blkB2, b.IP).MatchString(h.routes(t)) {
				t.Errorf("%s dropped b's block %s while b's daemon was down:\n%s", h.Name, blkB2, h.routes(t))
			}
		}
		if !learnedRoute(blkA, a.IP).MatchString(b.routes(t)) {
			t.Errorf("b lost its learned route to %s while its daemon was down:\n%s", blkA, b.routes(t))
		}
		b.plugin.Start(t)
		t.Logf("b's daemon restarted %s after kill -9", time.Since(killed).Round(time.Millisecond))
		others := []*bgpHost{a, hc}
		if len(c.hosts) > 3 {
			others = append(others, c.hosts[3])
		}
		st := b.waitPeers(t, expectPeers(b, others...), 30*time.Second)
		t.Logf("b's sessions re-established %s after kill -9", time.Since(killed).Round(time.Millisecond))
		if !mhContains(st.Advertised, blkB2) {
			t.Errorf("b advertises %v after restart, want %s", st.Advertised, blkB2)
		}
		wg.Wait()
		for name, r := range map[string]result{"a1": fromA, "c1": fromC} {
			if r.err != nil {
				t.Errorf("ping from %s: %v", name, r.err)
				continue
			}
			lost := r.tx - r.rx
			t.Logf("ping %s -> b2 across the restart: %d sent, %d received in %s", name, r.tx, r.rx, r.ran.Round(time.Millisecond))
			// ping ran through its whole window (-w), the restart inside
			// it: its run time says so; the count of pings sent, half the
			// nominal five a second as a busy host sends them late, says
			// it kept sending.
			if r.ran < pingSecs*time.Second || r.tx < pingSecs*5/2 {
				t.Errorf("ping from %s sent %d packets in %s: it did not run through its %d s window", name, r.tx, r.ran.Round(time.Millisecond), pingSecs)
			}
			// One second at 0.2 s intervals.
			if lost > 5 {
				t.Errorf("ping from %s lost %d of %d packets across b's restart (more than 1 s)", name, lost, r.tx)
			}
		}
		for _, h := range []*bgpHost{a, hc} {
			h.waitRoute(t, blkB2, b.IP, true, 10*time.Second)
		}
		a.waitPeers(t, expectPeers(a, b, hc, c.hosts[3]), 30*time.Second)
	})
}

// mhRun runs a command in the root namespaces and returns stdout; the error
// carries stderr.
func mhRun(ctx context.Context, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

func mhContains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestMultiHostInterop peers two calico-cnm hosts with real BGP routers as
// global peers with TCP MD5 passwords: bird2 (what Calico runs) as a ToR in
// AS 65000 and gobgpd in AS 65001. Both learn every block; each announces a
// prefix inside the pools (installed on the hosts, via the router) and one
// outside (rejected and counted, never installed).
func TestMultiHostInterop(t *testing.T) {
	t.Parallel()
	harness.RequireFile(t, "/usr/sbin/bird", "package bird2")
	harness.RequireFile(t, "/usr/bin/gobgpd", "package gobgpd")
	const torPW, gobgpPW = "tor-Secret-1", "gobgp-Secret-2"
	// gobgpd's password is a secret each node reads from its own secrets
	// directory: the datastore holds only its name.
	secrets := t.TempDir()
	if err := os.WriteFile(secrets+"/gobgpd-key", []byte(gobgpPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newBGPCluster(t)
	a, b := c.addHostTB(t, "a", "--bgp-secrets-dir", secrets), c.addHostTB(t, "b", "--bgp-secrets-dir", secrets)
	ipA, ipB := a.run(t, "a1"), b.run(t, "b1")
	blkA, blkB := blockOf26(ipA), blockOf26(ipB)
	b.waitRoute(t, blkA, a.IP, true, 30*time.Second)

	tor := c.fabric.AddHost(t, "tor", harness.HostOptions{NoDockerd: true})
	gb := c.fabric.AddHost(t, "gobgpd", harness.HostOptions{NoDockerd: true})

	// bird2 as the ToR.
	birdConf := fmt.Sprintf(`router id %[1]s;
log stderr all;
protocol device { }
protocol static announced {
	ipv4;
	route 10.99.0.0/24 blackhole;
	route 192.168.250.0/24 blackhole;
}
template bgp hosts {
	local %[1]s as 65000;
	password "%[2]s";
	graceful restart on;
	ipv4 { import all; export where proto = "announced"; };
}
protocol bgp host_a from hosts { neighbor %[3]s as 64512; }
protocol bgp host_b from hosts { neighbor %[4]s as 64512; }
`, tor.IP, torPW, a.IP, b.IP)
	birdDir := t.TempDir()
	confPath, sock := birdDir+"/bird.conf", birdDir+"/bird.ctl"
	if err := os.WriteFile(confPath, []byte(birdConf), 0o600); err != nil {
		t.Fatal(err)
	}
	tor.StartProcess(t, "bird", nil, func(ctx context.Context) error {
		_, err := tor.ExecCtx(ctx, "birdc", "-s", sock, "show", "status")
		return err
	}, "/usr/sbin/bird", "-c", confPath, "-s", sock, "-f")

	// gobgpd as a second router.
	gbConf := fmt.Sprintf(`[global.config]
  as = 65001
  router-id = "%[1]s"
  local-address-list = ["%[1]s"]
`, gb.IP)
	for _, h := range []*bgpHost{a, b} {
		gbConf += fmt.Sprintf(`
[[neighbors]]
  [neighbors.config]
    neighbor-address = "%s"
    peer-as = 64512
    auth-password = "%s"
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-unicast"
`, h.IP, gobgpPW)
	}
	gbDir := t.TempDir()
	if err := os.WriteFile(gbDir+"/gobgpd.toml", []byte(gbConf), 0o600); err != nil {
		t.Fatal(err)
	}
	gobgp := func(ctx context.Context, args ...string) (string, error) {
		return gb.ExecCtx(ctx, append([]string{"/usr/bin/gobgp", "-u", "127.0.0.1", "-p", "50051"}, args...)...)
	}
	gb.StartProcess(t, "gobgpd", nil, func(ctx context.Context) error {
		_, err := gobgp(ctx, "global")
		return err
	}, "/usr/bin/gobgpd", "-f", gbDir+"/gobgpd.toml", "-t", "toml", "--api-hosts", "127.0.0.1:50051", "-p", "--pprof-disable")
	for _, p := range []string{"10.98.0.0/24", "192.168.251.0/24"} {
		if out, err := gobgp(context.Background(), "global", "rib", "add", p, "-a", "ipv4"); err != nil {
			t.Fatalf("gobgp rib add %s: %v\n%s", p, err, out)
		}
	}

	// The peers, through the CLI: one password from the environment (kept
	// in the datastore), one a secret reference.
	out := c.mustCtlEnv(t, []string{"TOR_PW=" + torPW}, "bgp", "peer", "add", "tor", "--peer-ip", tor.IP.String(), "--as-number", "65000", "--password-env", "TOR_PW")
	out += c.mustCtl(t, "bgp", "peer", "add", "gobgpd", "--peer-ip", gb.IP.String(), "--as-number", "65001", "--password-secret", "gobgpd-key")
	list := c.mustCtl(t, "bgp", "peer", "list")
	listJSON := c.mustCtl(t, "bgp", "peer", "list", "-o", "json")
	for _, s := range []string{out, list, listJSON} {
		if strings.Contains(s, torPW) || strings.Contains(s, gobgpPW) {
			t.Errorf("the CLI printed a password:\n%s", s)
		}
	}
	if !regexp.MustCompile(`(?m)^tor\s.*\syes$`).MatchString(list) || !regexp.MustCompile(`(?m)^gobgpd\s.*\ssecret gobgpd-key$`).MatchString(list) {
		t.Errorf("peer list:\n%s", list)
	}
	if dump, err := mhRun(context.Background(), "etcdctl", "--endpoints", c.etcd, "get", "--prefix", "/calico-cnm/v1/bgp/"); err != nil || strings.Contains(dump, gobgpPW) || !strings.Contains(dump, "gobgpd-key") {
		t.Errorf("the datastore should hold the secret's name, not its content (err %v):\n%s", err, dump)
	}
	t.Logf("bgp peer list:\n%s", list)

	for _, h := range []*bgpHost{a, b} {
		want := map[string]routing.PeerType{tor.IP.String(): routing.PeerGlobal, gb.IP.String(): routing.PeerGlobal}
		for _, o := range []*bgpHost{a, b} {
			if o != h {
				want[o.IP.String()] = routing.PeerMesh
			}
		}
		h.waitPeers(t, want, 45*time.Second)
		// The listener takes the MD5 keys (plain TCP, not MPTCP): no warning.
		for _, unwanted := range []string{"failed to set md5", "cannot set TTL"} {
			if h.plugin.LogContains(unwanted) {
				t.Errorf("%s logged %q although MD5 works", h.Name, unwanted)
			}
		}
	}

	t.Run("bird learns every block", func(t *testing.T) {
		harness.Eventually(t, 30*time.Second, 250*time.Millisecond, "bird routes", func() error {
			out, err := tor.Exec(t, "birdc", "-s", sock, "show", "route")
			if err != nil {
				return err
			}
			for blk, via := range map[string]net.IP{blkA: a.IP, blkB: b.IP} {
				if !regexp.MustCompile(`(?s)` + regexp.QuoteMeta(blk) + `.*via ` + regexp.QuoteMeta(via.String())).MatchString(out) {
					return fmt.Errorf("no %s via %s:\n%s", blk, via, out)
				}
			}
			return nil
		})
	})

	t.Run("gobgpd learns every block", func(t *testing.T) {
		harness.Eventually(t, 30*time.Second, 250*time.Millisecond, "gobgpd routes", func() error {
			out, err := gobgp(context.Background(), "global", "rib", "-a", "ipv4")
			if err != nil {
				return err
			}
			for blk, via := range map[string]net.IP{blkA: a.IP, blkB: b.IP} {
				if !regexp.MustCompile(regexp.QuoteMeta(blk) + `\s+` + regexp.QuoteMeta(via.String())).MatchString(out) {
					return fmt.Errorf("no %s via %s:\n%s", blk, via, out)
				}
			}
			return nil
		})
	})

	t.Run("hosts install pool prefixes and reject the others", func(t *testing.T) {
		for _, h := range []*bgpHost{a, b} {
			h.waitRoute(t, "192.168.250.0/24", tor.IP, true, 30*time.Second)
			h.waitRoute(t, "192.168.251.0/24", gb.IP, true, 30*time.Second)
			r := h.routes(t)
			for _, outside := range []string{"10.99.0.0/24", "10.98.0.0/24"} {
				if strings.Contains(r, outside) {
					t.Errorf("%s installed %s, outside the pools:\n%s", h.Name, outside, r)
				}
			}
			st, err := h.status(t)
			if err != nil {
				t.Fatal(err)
			}
			if n := st.Rejected[routing.RejectNotInPool]; n != 2 {
				t.Errorf("%s counted %d paths outside the pools, want 2 (one per router): %v", h.Name, n, st.Rejected)
			}
			for _, p := range st.Peers {
				if p.Address == tor.IP.String() && (p.Received != 2 || p.Accepted != 1) {
					t.Errorf("%s: ToR received %d accepted %d, want 2 and 1", h.Name, p.Received, p.Accepted)
				}
			}
		}
	})

	t.Run("deleting a peer ends its session and its routes", func(t *testing.T) {
		c.mustCtl(t, "bgp", "peer", "delete", "gobgpd")
		for _, h := range []*bgpHost{a, b} {
			h.waitRoute(t, "192.168.251.0/24", gb.IP, false, 30*time.Second)
		}
		st, err := a.status(t)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Peers {
			if p.Address == gb.IP.String() {
				t.Errorf("a still has a session with the deleted peer: %+v", p)
			}
		}
		if _, err := c.ctl(t, "bgp", "peer", "delete", "gobgpd"); err == nil {
			t.Errorf("deleting a missing peer succeeded")
		}
	})
}

func (c *bgpCluster) mustCtlEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append([]string{c.bin}, append(args, "--etcd-endpoints", c.etcd)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("calico-cnm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
