package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

// The WireGuard tests: with `cluster set --wireguard on` every host keeps
// wireguard.cali (userspace here: the kernel has no WireGuard module) with
// one peer per other host, and routes the other hosts' blocks through it.

// wgStatus is the WireGuard part of `node status -o json` on h.
func wgStatus(t testing.TB, h *bgpHost) (wireguard.Status, error) {
	t.Helper()
	out, err := mhRun(context.Background(), h.c.bin, "node", "status", "-o", "json", "--state-dir", h.StateDir)
	if err != nil {
		return wireguard.Status{}, fmt.Errorf("node status on %s: %v: %s", h.Name, err, out)
	}
	var st struct {
		WireGuard *wireguard.Status `json:"wireguard"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return wireguard.Status{}, fmt.Errorf("node status -o json on %s: %v\n%s", h.Name, err, out)
	}
	if st.WireGuard == nil {
		return wireguard.Status{}, fmt.Errorf("node status on %s has no WireGuard part:\n%s", h.Name, out)
	}
	return *st.WireGuard, nil
}

// waitWGPeers waits until h's device runs with exactly the peers named,
// each with check passing (nil: any).
func waitWGPeers(t testing.TB, h *bgpHost, peers []string, check func(wireguard.PeerStatus) error) wireguard.Status {
	t.Helper()
	var st wireguard.Status
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, h.Name+": WireGuard peers "+strings.Join(peers, ","), func() error {
		var err error
		if st, err = wgStatus(t, h); err != nil {
			return err
		}
		if !st.Enabled || st.Device != wireguard.Device {
			return fmt.Errorf("device not up: %+v", st)
		}
		var got []string
		for _, p := range st.Peers {
			got = append(got, p.Node)
			if check != nil {
				if err := check(p); err != nil {
					return fmt.Errorf("peer %s: %w", p.Node, err)
				}
			}
		}
		if strings.Join(got, ",") != strings.Join(peers, ",") {
			return fmt.Errorf("peers %v, want %v", got, peers)
		}
		return nil
	})
	return st
}

// wgRoute matches "<block> dev wireguard.cali proto 83 scope link" in
// `ip route show table 99`.
func wgRoute(block string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(block) + ` dev wireguard\.cali proto 83 scope link\b`)
}

func waitWGRoute(t testing.TB, h *bgpHost, block string) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, h.Name+": WireGuard route to "+block, func() error {
		if out := h.MustExec(t, "ip", "route", "show", "table", "99"); !wgRoute(block).MatchString(out) {
			return fmt.Errorf("not in table 99:\n%s", out)
		}
		return nil
	})
}

// waitWGOff waits until h has no device, no route in table 99 and no
// rule to it.
func waitWGOff(t testing.TB, h *bgpHost) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, h.Name+": WireGuard removed", func() error {
		if out, err := h.Exec(t, "ip", "link", "show", wireguard.Device); err == nil {
			return fmt.Errorf("device still there: %s", out)
		}
		if out := h.MustExec(t, "ip", "route", "show", "table", "99"); strings.TrimSpace(out) != "" {
			return fmt.Errorf("table 99 not empty:\n%s", out)
		}
		if out := h.MustExec(t, "ip", "rule"); strings.Contains(out, "lookup 99") {
			return fmt.Errorf("rule still there:\n%s", out)
		}
		return nil
	})
}

// wgServers starts on every host a container "s<host>" serving iperf3 and
// returns their addresses by host name.
func wgServers(t *testing.T, hosts []*bgpHost) map[string]net.IP {
	t.Helper()
	ips := map[string]net.IP{}
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	for _, h := range hosts {
		h.ImportImage(t, "iperf", "/usr/bin/iperf3")
		name := "s" + h.Name
		h.MustDocker(t, "run", "-d", "--name", name, "--net", mhNetwork, "iperf", "iperf3", "-s")
		ips[h.Name] = net.ParseIP(strings.TrimSpace(h.MustDocker(t, "inspect", "-f", tmpl, name)))
	}
	return ips
}

// sendMarker sends marker over TCP from host from's server container to
// host to's, and waits until it arrived.
func sendMarker(t *testing.T, from, to *bgpHost, toIP net.IP, marker string) {
	t.Helper()
	got := "/tmp/got-" + from.Name
	// busybox nc serves one connection: a connection that brought no
	// data (made while the listener started) must not leave the port
	// closed for the retries.
	to.MustDocker(t, "exec", "-d", "s"+to.Name, "sh", "-c", "while :; do nc -l -p 7777 >> "+got+"; done")
	harness.Eventually(t, 20*time.Second, 300*time.Millisecond, fmt.Sprintf("marker %s -> %s", from.Name, to.Name), func() error {
		if out, err := to.Docker(t, "exec", "s"+to.Name, "cat", got); err == nil && strings.Contains(out, marker) {
			return nil
		}
		out, err := from.Docker(t, "exec", "s"+from.Name, "sh", "-c", "echo "+marker+" | nc -w 2 "+toIP.String()+" 7777")
		return fmt.Errorf("not arrived yet (nc: %v %s)", err, out)
	})
}

// routerCapture runs tcpdump on the router until the returned stop, which
// returns the path of the capture.
func routerCapture(t *testing.T, r *harness.Router, name string) func() string {
	t.Helper()
	pcap := filepath.Join(t.TempDir(), name+".pcap")
	p := r.Host.StartProcess(t, "tcpdump-"+name, nil, func(context.Context) error {
		if fi, err := os.Stat(pcap); err != nil || fi.Size() < 24 {
			return fmt.Errorf("no capture yet")
		}
		return nil
	}, "tcpdump", "-i", "any", "-nn", "-U", "-Z", "root", "-s", "256", "-w", pcap)
	return func() string {
		_ = p.Stop(t)
		return pcap
	}
}

// checkCapture fails unless the capture has WireGuard packets and neither
// a pool address nor marker.
func checkCapture(t *testing.T, r *harness.Router, pcap, marker string) {
	t.Helper()
	count := func(filter string) int {
		out := r.MustExec(t, "sh", "-c", "tcpdump -r "+pcap+" -nn "+filter+" 2>/dev/null | wc -l")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("counting %q in the capture: %v: %s", filter, err, out)
		}
		return n
	}
	if n := count("net " + mhPool); n != 0 {
		t.Errorf("%d packets crossed the router with a pool address in clear:\n%s", n, r.MustExec(t, "sh", "-c", "tcpdump -r "+pcap+" -nn net "+mhPool+" 2>/dev/null | head"))
	}
	if n := strings.TrimSpace(r.MustExec(t, "sh", "-c", "tcpdump -r "+pcap+" -nn -A 2>/dev/null | grep -c "+marker+" || true")); n != "0" {
		t.Errorf("the marker %q crossed the router in clear (%s packets)", marker, n)
	}
	if n := count("udp port 51820"); n < 20 {
		t.Errorf("the router saw %d WireGuard packets, want the ping and nc traffic", n)
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// TestWireGuardAcrossRouter: hosts a and b on one subnet, c on another
// behind a router that has no route to the pool; VXLAN (pool Always)
// distributes reachability. With WireGuard on, containers on every pair of
// hosts ping each other and run iperf3, and the router sees only
// WireGuard: no pool address, not the marker sent with nc. Off removes
// device, routes and rule and VXLAN carries the traffic again; on again
// encrypts again. A daemon restart keeps a TCP stream going.
func TestWireGuardAcrossRouter(t *testing.T) {
	t.Parallel()
	harness.RequireFile(t, "/usr/bin/iperf3", "package iperf3")
	harness.RequireFile(t, "/usr/bin/tcpdump", "package tcpdump")
	c, f2, r := newVXLANCluster(t, "Always")
	a := c.addHostOn(t, c.fabric, "a", "--metrics-listen", wgMetricsAddr)
	b := c.addHostOn(t, c.fabric, "b")
	cc := c.addHostOn(t, f2, "c")
	hosts := []*bgpHost{a, b, cc}
	r.RouteHosts(t, a.Host, b.Host, cc.Host)

	others := map[string][]string{}
	for _, h := range hosts {
		for _, o := range hosts {
			if o != h {
				others[h.Name] = append(others[h.Name], o.Name)
			}
		}
	}
	c.mustCtl(t, "cluster", "set", "--wireguard", "on")
	for _, h := range hosts {
		st := waitWGPeers(t, h, others[h.Name], nil)
		if st.Implementation != wireguard.ImplUserspace || st.Mode != wireguard.ModeRequired || st.MTU != 1440 {
			t.Errorf("%s: implementation %s, mode %s, MTU %d; want userspace, required, 1440", h.Name, st.Implementation, st.Mode, st.MTU)
		}
		checkKeyFile(t, c, h, st.PublicKey)
	}
	ips := wgServers(t, hosts)
	for _, h := range hosts {
		if mtu := h.MustDocker(t, "exec", "s"+h.Name, "cat", "/sys/class/net/eth0/mtu"); mtu != "1390" {
			t.Errorf("%s: container MTU %s, want 1390 (1500 - 60 WireGuard - 50 VXLAN)", h.Name, mtu)
		}
		for _, o := range hosts {
			if o != h {
				waitWGRoute(t, h, blockOf26(ips[o.Name]))
			}
		}
	}

	before := nftCounters(t, r.Host, "cnme2e", "pre")
	stop := routerCapture(t, r, "on")
	const marker = "WGMARKER-7f3a91"
	for _, from := range hosts {
		for _, to := range hosts {
			if from == to {
				continue
			}
			from.ping(t, "s"+from.Name, ips[to.Name])
			sendMarker(t, from, to, ips[to.Name], marker)
		}
	}
	// The host itself, from its device address, to another host's container.
	for i, from := range hosts {
		to := hosts[(i+1)%len(hosts)]
		if out := from.MustExec(t, "ip", "-4", "-o", "addr", "show", wireguard.Device); !strings.Contains(out, "inet 192.168.") {
			t.Errorf("%s: %s has no address of the pool:\n%s", from.Name, wireguard.Device, out)
		}
		harness.Eventually(t, 10*time.Second, 200*time.Millisecond, from.Name+" (host) pings "+to.Name+"'s container", func() error {
			out, err := from.Exec(t, "ping", "-c", "1", "-W", "1", ips[to.Name].String())
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	for i, from := range hosts {
		to := hosts[(i+1)%len(hosts)]
		out, err := from.Docker(t, "exec", "s"+from.Name, "iperf3", "-c", ips[to.Name].String(), "-t", "2", "-J")
		t.Logf("iperf3 %s -> %s through WireGuard: %.0f Mbit/s", from.Name, to.Name, iperfBPS(t, out, err)/1e6)
	}
	checkCapture(t, r, stop(), marker)
	after := nftCounters(t, r.Host, "cnme2e", "pre")
	for _, k := range []string{"pool-src", "pool-dst", "vxlan"} {
		if after[k] != before[k] {
			t.Errorf("router counter %s rose by %d with WireGuard on; want 0 (all container traffic encrypted)", k, after[k]-before[k])
		}
	}
	for _, h := range hosts {
		waitWGPeers(t, h, others[h.Name], func(p wireguard.PeerStatus) error {
			if p.LastHandshake.IsZero() || p.Handshakes == 0 || p.RxBytes == 0 || p.TxBytes == 0 {
				return fmt.Errorf("no handshake or no traffic: %+v", p)
			}
			return nil
		})
	}
	checkWGMetrics(t, a)

	t.Run("restart keeps a TCP stream", func(t *testing.T) {
		done := make(chan error, 1)
		var out string
		go func() {
			var err error
			out, err = b.Docker(t, "exec", "sb", "iperf3", "-c", ips["a"].String(), "-t", "8", "-J")
			done <- err
		}()
		rx := func() int64 {
			st, err := wgStatus(t, a)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range st.Peers {
				if p.Node == "b" {
					return p.RxBytes
				}
			}
			return 0
		}
		start := rx()
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "iperf3 b -> a running", func() error {
			if n := rx() - start; n < 1<<20 {
				return fmt.Errorf("a received %d bytes from b", n)
			}
			return nil
		})
		a.plugin.Restart(t)
		restarted := time.Now()
		waitWGPeers(t, a, others["a"], nil)
		t.Logf("a's daemon answers again; its WireGuard peers were back %s later", time.Since(restarted).Round(time.Millisecond))
		bps := iperfBPS(t, out, <-done)
		t.Logf("iperf3 b -> a across a's daemon restart: %.0f Mbit/s", bps/1e6)
	})

	c.mustCtl(t, "cluster", "set", "--wireguard", "off")
	for _, h := range hosts {
		waitWGOff(t, h)
	}
	before = nftCounters(t, r.Host, "cnme2e", "pre")
	for i, from := range hosts {
		to := hosts[(i+1)%len(hosts)]
		from.ping(t, "s"+from.Name, ips[to.Name])
	}
	if after := nftCounters(t, r.Host, "cnme2e", "pre"); after["vxlan"] == before["vxlan"] {
		t.Errorf("with WireGuard off no VXLAN packet crossed the router: %v -> %v", before, after)
	}
	store := c.openStore(t)
	for _, h := range hosts {
		var n datastore.Node
		if _, err := store.GetJSON(context.Background(), datastore.NodeKey(h.Name), &n); err != nil {
			t.Fatal(err)
		}
		if n.WireGuardPublicKey != "" || n.WireGuardAddr != "" || n.WireGuardInterfaceAddr != "" {
			t.Errorf("%s's record still carries WireGuard fields with WireGuard off: %+v", h.Name, n)
		}
	}

	c.mustCtl(t, "cluster", "set", "--wireguard", "on")
	before = nftCounters(t, r.Host, "cnme2e", "pre")
	stop = routerCapture(t, r, "again")
	for i, from := range hosts {
		to := hosts[(i+1)%len(hosts)]
		waitWGRoute(t, from, blockOf26(ips[to.Name]))
		from.ping(t, "s"+from.Name, ips[to.Name])
		sendMarker(t, from, to, ips[to.Name], marker+"-again")
	}
	checkCapture(t, r, stop(), marker+"-again")
	after = nftCounters(t, r.Host, "cnme2e", "pre")
	if after["pool-src"] != before["pool-src"] || after["vxlan"] != before["vxlan"] {
		t.Errorf("with WireGuard on again, clear or VXLAN traffic crossed the router: %v -> %v", before, after)
	}
}

// checkKeyFile: h's private key is in its state dir, mode 0600, matches
// the public key it reports, and is nowhere in the datastore.
func checkKeyFile(t *testing.T, c *bgpCluster, h *bgpHost, pub string) {
	t.Helper()
	path := filepath.Join(h.StateDir, wireguard.KeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("%s: %v", h.Name, err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: key file mode %v, want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if priv.PublicKey().String() != pub {
		t.Errorf("%s: node status reports public key %s, the key file's is %s", h.Name, pub, priv.PublicKey())
	}
	store := c.openStore(t)
	kvs, err := store.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if strings.Contains(string(kv.Value), priv.String()) {
			t.Errorf("the private key of %s is in the datastore at %s", h.Name, kv.Key)
		}
	}
	var n datastore.Node
	kv, err := store.Get(context.Background(), datastore.NodeKey(h.Name))
	if err != nil || json.Unmarshal(kv.Value, &n) != nil || n.WireGuardPublicKey != pub || n.WireGuardPort != wireguard.DefaultPort || n.WireGuardAddr != h.IP.String() {
		t.Errorf("%s's record: %+v (%v); want key %s at %s:%d", h.Name, n, err, pub, h.IP, wireguard.DefaultPort)
	}
}

const wgMetricsAddr = "127.0.0.1:9091"

// checkWGMetrics: /metrics of h has handshakes and bytes per peer.
func checkWGMetrics(t *testing.T, h *bgpHost) {
	t.Helper()
	out := h.MustExec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+wgMetricsAddr+"/metrics")
	for _, want := range []string{wireguard.MetricHandshakes + `{peer="b"`, wireguard.MetricRxBytes + `{peer="c"`, wireguard.MetricTxBytes + `{peer="b"`, wireguard.MetricLastHandshake + `{peer="c"`} {
		if !strings.Contains(out, want) {
			t.Errorf("%s /metrics lacks %s", h.Name, want)
		}
	}
}

// TestWireGuardWrongKey: BGP on one subnet, WireGuard on (required). A
// key rotation on b costs at most a retry of a ping stream. Then c's
// record gets a public key c does not hold: a and c exchange no traffic,
// although BGP's clear route to c's block is there (no fallback), and
// both logs say why; `node rotate-key` on c publishes a good key and the
// traffic resumes.
func TestWireGuardWrongKey(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b, hc := c.addHost(t, "a"), c.addHost(t, "b"), c.addHost(t, "c")
	c.mustCtl(t, "cluster", "set", "--wireguard", "on", "--wireguard-mode", "required")
	waitWGPeers(t, a, []string{"b", "c"}, nil)
	waitWGPeers(t, b, []string{"a", "c"}, nil)
	waitWGPeers(t, hc, []string{"a", "b"}, nil)
	ipA, ipB, ipC := a.run(t, "ca"), b.run(t, "cb"), hc.run(t, "cc")
	for _, h := range []*bgpHost{a, b, hc} {
		if mtu := h.MustDocker(t, "exec", "c"+h.Name, "cat", "/sys/class/net/eth0/mtu"); mtu != "1440" {
			t.Errorf("%s: container MTU %s, want 1440 (1500 - 60)", h.Name, mtu)
		}
	}
	waitWGRoute(t, a, blockOf26(ipC))
	waitWGRoute(t, a, blockOf26(ipB))
	a.ping(t, "ca", ipC)
	a.ping(t, "ca", ipB)
	hc.ping(t, "cc", ipA)

	t.Run("rotate-key costs at most one retry", func(t *testing.T) {
		old, err := wgStatus(t, b)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			tx, rx int
			out    string
			err    error
		}
		done := make(chan result, 1)
		go func() {
			tx, rx, out, err := pingStats(context.Background(), a, "ca", ipB, 12)
			done <- result{tx, rx, out, err}
		}()
		out := c.mustCtl(t, "node", "rotate-key", "--state-dir", b.StateDir)
		if !strings.Contains(out, "new WireGuard public key: ") || strings.Contains(out, old.PublicKey) {
			t.Errorf("rotate-key printed %q (old key %s)", out, old.PublicKey)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		// Pings every 0.2 s; one handshake retry is 5 s.
		if lost := r.tx - r.rx; lost > 27 {
			t.Errorf("the rotation lost %d of %d pings (more than one 5 s retry):\n%s", lost, r.tx, r.out)
		}
		t.Logf("rotate-key on b: %d of %d pings lost", r.tx-r.rx, r.tx)
		st, err := wgStatus(t, b)
		if err != nil || st.PublicKey == old.PublicKey {
			t.Errorf("b's key after rotate-key: %s (%v), was %s", st.PublicKey, err, old.PublicKey)
		}
	})

	wrong, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	store := c.openStore(t)
	ctx := context.Background()
	var rec datastore.Node
	rev, err := store.GetJSON(ctx, datastore.NodeKey("c"), &rec)
	if err != nil {
		t.Fatal(err)
	}
	rec.WireGuardPublicKey = wrong.PublicKey().String()
	if err := store.Txn(ctx, datastore.Update(datastore.NodeKey("c"), datastore.MustJSON(rec), rev)); err != nil {
		t.Fatal(err)
	}
	waitWGPeers(t, a, []string{"b", "c"}, func(p wireguard.PeerStatus) error {
		if p.Node == "c" && p.PublicKey != rec.WireGuardPublicKey {
			return fmt.Errorf("still has key %s", p.PublicKey)
		}
		return nil
	})
	if out, err := a.Docker(t, "exec", "ca", "ping", "-c", "3", "-W", "1", ipC.String()); err == nil {
		t.Errorf("ca reached cc although c's record carries a key c does not hold:\n%s", out)
	}
	if out, err := hc.Docker(t, "exec", "cc", "ping", "-c", "2", "-W", "1", ipA.String()); err == nil {
		t.Errorf("cc reached ca although a encrypts to a key c does not hold:\n%s", out)
	}
	a.ping(t, "ca", ipB)
	// The clear path exists (BGP) but is not taken.
	a.waitRoute(t, blockOf26(ipC), hc.IP, true, 10*time.Second)
	if out := a.MustExec(t, "ip", "route", "show", "table", "99"); !wgRoute(blockOf26(ipC)).MatchString(out) {
		t.Errorf("a no longer routes c's block through WireGuard:\n%s", out)
	}
	harness.Eventually(t, 60*time.Second, 500*time.Millisecond, "the logs say why", func() error {
		_, _ = a.Docker(t, "exec", "ca", "ping", "-c", "1", "-W", "1", ipC.String())
		for h, want := range map[*bgpHost]string{
			hc: "record carries a WireGuard public key that is not this node's",
			a:  "no WireGuard handshake with c",
		} {
			if !h.plugin.LogContains(want) {
				return fmt.Errorf("%s's log lacks %q", h.Name, want)
			}
		}
		return nil
	})

	out := c.mustCtl(t, "node", "rotate-key", "--state-dir", hc.StateDir)
	t.Logf("c: %s", strings.TrimSpace(out))
	fresh, ok := strings.CutPrefix(strings.TrimSpace(out), "new WireGuard public key: ")
	if !ok {
		t.Fatalf("rotate-key on c printed %q", out)
	}
	// The pings' time starts once a encrypts to c's new key: a's pass
	// that reprograms the peer took 5 s on a loaded machine, and the
	// handshake after it waits for a's next packet.
	waitWGPeers(t, a, []string{"b", "c"}, func(p wireguard.PeerStatus) error {
		if p.Node == "c" && p.PublicKey != fresh {
			return fmt.Errorf("still has key %s, not c's new %s", p.PublicKey, fresh)
		}
		return nil
	})
	a.ping(t, "ca", ipC)
	hc.ping(t, "cc", ipA)
}

// TestReadmeWireGuard pastes the README's WireGuard block on a host
// running `make run`: the setting brings up the userspace device and the
// rule, containers get the encrypted MTU, the key rotates, and off removes
// the device again.
func TestReadmeWireGuard(t *testing.T) {
	t.Parallel()
	buildCheckout(t)
	sb := newUserSandbox(t, "readme-wireguard", "make run")
	sb.waitFor(t, "/run/docker/plugins/calico-ipam.sock", 4*time.Minute)
	text := sb.shell(t, readmeBlock(t, "wireguard"), 3*time.Minute)
	requireOutput(t, text,
		"cluster configuration updated",
		"wireguard:       on",
		"wireguard mode:  required",
		"WireGuard: device wireguard.cali (userspace), mode required, listening on ",
		"not from all fwmark 0x100000/0x100000 lookup 99",
		"\n1440\n",
		"new WireGuard public key: ",
		"wireguard:       off",
		"pool 10.45.0.0/16 deleted",
	)
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "wireguard.cali removed", func() error {
		if out, err := sb.host.Exec(t, "ip", "link", "show", wireguard.Device); err == nil {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}
