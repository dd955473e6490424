package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
	"github.com/calico-cnm/calico-cnm/vxlan"
)

// The VXLAN tests: hosts in two subnets (two fabrics) joined by a router
// netns that has no route to the pool, so containers on different sides
// only talk if their packets are encapsulated.

// newVXLANCluster is a BGP cluster's etcd and CLI on fabric f1 (pool
// 192.168.0.0/16 switched to vxlanMode mode on the live pool), a second
// fabric f2 and the router between them, which counts in prerouting what
// it receives from and to the pool, and VXLAN packets.
func newVXLANCluster(t *testing.T, mode string) (*bgpCluster, *harness.Fabric, *harness.Router) {
	t.Helper()
	c := newBGPCluster(t)
	c.mustCtl(t, "pool", "set", mhPool, "--vxlan-mode", mode)
	f2 := harness.NewFabric(t, "")
	r := harness.NewRouter(t, "router", c.fabric, f2)
	script := strings.Join([]string{
		"nft add table ip cnme2e",
		"nft add chain ip cnme2e pre '{ type filter hook prerouting priority -300; }'",
		"nft add rule ip cnme2e pre ip saddr " + mhPool + " counter comment \\\"pool-src\\\"",
		"nft add rule ip cnme2e pre ip daddr " + mhPool + " counter comment \\\"pool-dst\\\"",
		"nft add rule ip cnme2e pre udp dport 4789 counter comment \\\"vxlan\\\"",
	}, " && ")
	r.MustExec(t, "sh", "-c", script)
	return c, f2, r
}

// nftCounters reads the packet counters of a chain by rule comment, with
// the nft binary in the host's netns (independent of the daemon's code).
func nftCounters(t *testing.T, h *harness.Host, table, chain string) map[string]uint64 {
	t.Helper()
	out := h.MustExec(t, "nft", "-j", "list", "chain", "ip", table, chain)
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Comment string           `json:"comment"`
				Expr    []map[string]any `json:"expr"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("nft -j on %s: %v\n%s", h.Name, err, out)
	}
	got := map[string]uint64{}
	for _, item := range doc.Nftables {
		if item.Rule == nil {
			continue
		}
		for _, e := range item.Rule.Expr {
			if c, ok := e["counter"].(map[string]any); ok {
				if n, ok := c["packets"].(float64); ok {
					got[item.Rule.Comment] += uint64(n)
				}
			}
		}
	}
	return got
}

// vxlanRoute matches "<block> via <vtep> dev vxlan.calico proto 82 onlink".
func vxlanRoute(block, vtep string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(block) + ` via ` + regexp.QuoteMeta(vtep) + ` dev vxlan\.calico proto 82 onlink\b`)
}

// vtepOf waits until n has registered its VTEP and returns it.
func (c *bgpCluster) vtepOf(t testing.TB, n *bgpHost) string {
	t.Helper()
	var vtep string
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, n.Name+": VTEP registered", func() error {
		var rows []struct{ Name, VTEP, VTEPMAC string }
		out, err := c.ctl(t, "node", "list", "-o", "json")
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			return err
		}
		for _, r := range rows {
			if r.Name == n.Name && r.VTEP != "" {
				if r.VTEPMAC != vxlan.VTEPMAC(n.Name).String() {
					return fmt.Errorf("VTEP MAC %s, want %s", r.VTEPMAC, vxlan.VTEPMAC(n.Name))
				}
				vtep = r.VTEP
				return nil
			}
		}
		return fmt.Errorf("no VTEP for %s in %s", n.Name, out)
	})
	return vtep
}

// waitIPRoute waits until h's `ip route` matches re.
func waitIPRoute(t testing.TB, h *bgpHost, what string, re *regexp.Regexp) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, h.Name+": "+what, func() error {
		if out := h.MustExec(t, "ip", "-4", "route"); !re.MatchString(out) {
			return fmt.Errorf("no %s in:\n%s", re, out)
		}
		return nil
	})
}

// iperfPair imports the iperf3 image on both hosts and starts a client
// container (sleeping) on cli and a server container (iperf3 -s) on srv, on
// net1; it returns their addresses.
func iperfPair(tb testing.TB, cli *bgpHost, cliName string, srv *bgpHost, srvName string) (net.IP, net.IP) {
	const img = "iperf"
	for _, h := range []*bgpHost{cli, srv} {
		h.ImportImage(tb, img, "/usr/bin/iperf3")
	}
	cli.MustDocker(tb, "run", "-d", "--name", cliName, "--net", mhNetwork, img, "sleep", "3600")
	srv.MustDocker(tb, "run", "-d", "--name", srvName, "--net", mhNetwork, img, "iperf3", "-s")
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	return net.ParseIP(cli.MustDocker(tb, "inspect", "-f", tmpl, cliName)), net.ParseIP(srv.MustDocker(tb, "inspect", "-f", tmpl, srvName))
}

func iperfBPS(t testing.TB, out string, err error) float64 {
	if err != nil {
		t.Fatalf("iperf3: %v\n%s", err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.End.SumReceived.BitsPerSecond == 0 {
		t.Fatalf("iperf3 -J output: %v\n%s", err, out)
	}
	return r.End.SumReceived.BitsPerSecond
}

// TestVXLANAcrossRouter: BGP off, hosts a and b in different subnets,
// pool Always. Containers ping each other and an iperf3 stream runs; the
// router sees VXLAN and never a pool address. A VXLAN packet from a
// non-node is dropped and counted; node delete of b removes its neighbour,
// FDB entry and route on a.
func TestVXLANAcrossRouter(t *testing.T) {
	t.Parallel()
	harness.RequireFile(t, "/usr/bin/iperf3", "package iperf3")
	c, f2, r := newVXLANCluster(t, "Always")
	a := c.addHostOn(t, c.fabric, "a")
	b := c.addHostOn(t, f2, "b")
	r.RouteHosts(t, a.Host, b.Host)
	caIP, cbIP := iperfPair(t, a, "ca", b, "cb")
	vtepA, vtepB := c.vtepOf(t, a), c.vtepOf(t, b)
	waitIPRoute(t, a, "VXLAN route to b's block", vxlanRoute(blockOf26(cbIP), vtepB))
	waitIPRoute(t, b, "VXLAN route to a's block", vxlanRoute(blockOf26(caIP), vtepA))

	// The device as Calico makes it.
	dev := a.MustExec(t, "ip", "-d", "link", "show", "vxlan.calico")
	for _, want := range []string{"vxlan id 4096", "local " + a.IP.String(), "dstport 4789", "nolearning", "link/ether " + vxlan.VTEPMAC("a").String(), "mtu 1450"} {
		if !strings.Contains(dev, want) {
			t.Errorf("vxlan.calico on a lacks %q:\n%s", want, dev)
		}
	}
	if neigh := a.MustExec(t, "ip", "neigh", "show", "dev", "vxlan.calico"); !strings.Contains(neigh, vtepB+" lladdr "+vxlan.VTEPMAC("b").String()+" PERMANENT") {
		t.Errorf("a has no permanent neighbour for b's VTEP:\n%s", neigh)
	}
	if fdb := a.MustExec(t, "bridge", "fdb", "show", "dev", "vxlan.calico"); !strings.Contains(fdb, vxlan.VTEPMAC("b").String()+" dst "+b.IP.String()) {
		t.Errorf("a has no FDB entry for b:\n%s", fdb)
	}
	if mtu := a.MustDocker(t, "exec", "ca", "cat", "/sys/class/net/eth0/mtu"); mtu != "1450" {
		t.Errorf("container MTU on a VXLAN pool = %s, want 1450 (1500 - 50)", mtu)
	}

	a.ping(t, "ca", cbIP)
	b.ping(t, "cb", caIP)
	out, err := a.Docker(t, "exec", "ca", "iperf3", "-c", cbIP.String(), "-t", "3", "-J")
	bps := iperfBPS(t, out, err)
	t.Logf("iperf3 ca -> cb over VXLAN through the router: %.2f Gbit/s", bps/1e9)

	rc := nftCounters(t, r.Host, "cnme2e", "pre")
	if rc["pool-src"] != 0 || rc["pool-dst"] != 0 {
		t.Errorf("pool addresses crossed the router unencapsulated: %v", rc)
	}
	if rc["vxlan"] < 1000 {
		t.Errorf("the router saw %d VXLAN packets, want the ping and iperf3 traffic", rc["vxlan"])
	}
	t.Logf("router counters: %v", rc)

	st, err := a.status(t)
	if err != nil {
		t.Fatal(err)
	}
	if !st.BGPOff || st.VXLAN == nil || st.VXLAN.VTEP != vtepA || len(st.VXLAN.Nodes) != 1 || st.VXLAN.Nodes[0].Routes != routing.RouteVXLAN || st.VXLAN.Nodes[0].VTEP != vtepB {
		t.Errorf("node status on a: %+v (VXLAN %+v)", st, st.VXLAN)
	}
	if out, err := mhRun(t.Context(), c.bin, "node", "list", "--etcd-endpoints", c.etcd, "--state-dir", a.StateDir); err != nil || !regexp.MustCompile(`(?m)^b\s.*\s`+regexp.QuoteMeta(vtepB)+`\s+vxlan$`).MatchString(out) {
		t.Errorf("node list (from a's view) does not show b's VTEP and vxlan: %v\n%s", err, out)
	}

	// VXLAN from a non-node address is dropped and counted.
	before := nftCounters(t, a.Host, policy.TableName, policy.ChainVXLAN)
	if before["VXLAN from a cluster node"] == 0 {
		t.Errorf("a's VXLAN filter accepted nothing from b: %v", before)
	}
	stranger := c.fabric.AddHost(t, "stranger", harness.HostOptions{NoDockerd: true})
	for range 3 {
		stranger.MustExec(t, "bash", "-c", "echo forged > /dev/udp/"+a.IP.String()+"/4789")
	}
	harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "a counts the forged VXLAN packets", func() error {
		after := nftCounters(t, a.Host, policy.TableName, policy.ChainVXLAN)
		if got := after["VXLAN from a non-node address"] - before["VXLAN from a non-node address"]; got != 3 {
			return fmt.Errorf("drop counter grew by %d, want 3 (%v)", got, after)
		}
		return nil
	})

	// node delete b: its neighbour, FDB entry and route go from a. The
	// container goes first (dockerd cannot remove it without the plugin);
	// b's VTEP address keeps its block, and a's route to it.
	b.MustDocker(t, "rm", "-f", "cb")
	waitIPRoute(t, a, "VXLAN route to the block of b's VTEP", vxlanRoute(blockOf26(net.ParseIP(vtepB)), vtepB))
	if err := b.plugin.Stop(t); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(t, "node", "delete", "b")
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "a forgets b", func() error {
		if out := a.MustExec(t, "ip", "-4", "route"); strings.Contains(out, "via "+vtepB) {
			return fmt.Errorf("route via b's VTEP remains:\n%s", out)
		}
		if out := a.MustExec(t, "ip", "neigh", "show", "dev", "vxlan.calico"); strings.Contains(out, vtepB) {
			return fmt.Errorf("neighbour remains: %s", out)
		}
		if out := a.MustExec(t, "bridge", "fdb", "show", "dev", "vxlan.calico"); strings.Contains(out, vxlan.VTEPMAC("b").String()) {
			return fmt.Errorf("FDB entry remains: %s", out)
		}
		return nil
	})
}

// TestVXLANCrossSubnetWithBGP: BGP on, pool CrossSubnet; a and c share a
// subnet, b is behind the router. a <-> c is routed directly (the BGP
// route, no vxlan device), a <-> b and c <-> b through VXLAN (the BGP path
// to b's block is not installed over it).
func TestVXLANCrossSubnetWithBGP(t *testing.T) {
	t.Parallel()
	c, f2, r := newVXLANCluster(t, "CrossSubnet")
	a := c.addHostOn(t, c.fabric, "a", "--bgp")
	hc := c.addHostOn(t, c.fabric, "c", "--bgp")
	b := c.addHostOn(t, f2, "b", "--bgp")
	r.RouteHosts(t, a.Host, hc.Host, b.Host)
	ca, cb, cc := a.run(t, "ca"), b.run(t, "cb"), hc.run(t, "cc")
	vtepB := c.vtepOf(t, b)
	c.vtepOf(t, a)
	c.vtepOf(t, hc)
	a.waitPeers(t, map[string]routing.PeerType{b.IP.String(): routing.PeerMesh, hc.IP.String(): routing.PeerMesh}, 60*time.Second)

	waitIPRoute(t, a, "direct BGP route to c's block", learnedRoute(blockOf26(cc), hc.IP))
	waitIPRoute(t, hc, "direct BGP route to a's block", learnedRoute(blockOf26(ca), a.IP))
	waitIPRoute(t, a, "VXLAN route to b's block", vxlanRoute(blockOf26(cb), vtepB))
	waitIPRoute(t, hc, "VXLAN route to b's block", vxlanRoute(blockOf26(cb), vtepB))
	routes := a.MustExec(t, "ip", "-4", "route", "show", blockOf26(cb))
	if strings.Count(strings.TrimSpace(routes), "\n") != 0 || strings.Contains(routes, "proto 81") {
		t.Errorf("a has more than the VXLAN route to b's block (BGP must not override it):\n%s", routes)
	}
	if direct := a.MustExec(t, "ip", "-4", "route", "show", blockOf26(cc)); strings.Contains(direct, "vxlan") {
		t.Errorf("a reaches c (same subnet) through VXLAN: %s", direct)
	}
	a.ping(t, "ca", cc)
	hc.ping(t, "cc", ca)
	a.ping(t, "ca", cb)
	b.ping(t, "cb", ca)
	hc.ping(t, "cc", cb)

	rc := nftCounters(t, r.Host, "cnme2e", "pre")
	if rc["pool-src"] != 0 || rc["pool-dst"] != 0 || rc["vxlan"] == 0 {
		t.Errorf("router counters %v: want VXLAN and no bare pool address", rc)
	}
	st, err := a.status(t)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]routing.RouteKind{}
	if st.VXLAN != nil {
		for _, n := range st.VXLAN.Nodes {
			kinds[n.Name] = n.Routes
		}
	}
	if kinds["b"] != routing.RouteVXLAN || kinds["c"] != routing.RouteBGP {
		t.Errorf("node status on a: route kinds %v, want b vxlan, c bgp", kinds)
	}
	for _, h := range []*bgpHost{a, b, hc} {
		if mtu := h.MustDocker(t, "exec", "c"+h.Name, "cat", "/sys/class/net/eth0/mtu"); mtu != strconv.Itoa(1500-vxlan.Overhead) {
			t.Errorf("%s: container MTU %s on a CrossSubnet pool, want 1450", h.Name, mtu)
		}
	}
}
