package e2e

import (
	"net"
	"regexp"
	"slices"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// BenchmarkMultiHostVXLANIperf: TCP throughput of one container pair on two
// hosts of one subnet (BGP off), routed directly (CrossSubnet: same subnet)
// and through VXLAN (the same pool switched to Always), and host to host;
// 5 rounds, each measuring the three in turn, medians reported. Target:
// VXLAN at least 0.80x of direct routing. Both modes run with the
// containers' MTU of 1450 (the pool may encapsulate in both).
func BenchmarkMultiHostVXLANIperf(b *testing.B) {
	harness.RequireFile(b, "/usr/bin/iperf3", "package iperf3")
	harness.RequirePrereqs(b)
	c := &bgpCluster{bin: harness.BuildBinary(b), fabric: harness.NewFabric(b, "")}
	c.etcd = c.fabric.StartEtcd(b)
	if out, err := c.ctl(b, "pool", "add", mhPool, "--vxlan-mode", "CrossSubnet"); err != nil {
		b.Fatalf("pool add: %v\n%s", err, out)
	}
	ha := c.addHostOn(b, c.fabric, "a", "--log-level", "info")
	hb := c.addHostOn(b, c.fabric, "b", "--log-level", "info")
	cliIP, srvIP := iperfPair(b, ha, "cli", hb, "srv")
	hb.StartProcess(b, "iperf3-host", nil, harness.TCPReady(hb.IP.String()+":5201"), "/usr/bin/iperf3", "-s", "-B", hb.IP.String())
	vtepA, vtepB := c.vtepOf(b, ha), c.vtepOf(b, hb)

	direct := func(block string, via net.IP) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(block) + ` via ` + regexp.QuoteMeta(via.String()) + ` dev eth0 proto 82\b`)
	}
	setMode := func(mode string) {
		if out, err := c.ctl(b, "pool", "set", mhPool, "--vxlan-mode", mode); err != nil {
			b.Fatalf("pool set: %v\n%s", err, out)
		}
		toB, toA := direct(blockOf26(srvIP), hb.IP), direct(blockOf26(cliIP), ha.IP)
		if mode == "Always" {
			toB, toA = vxlanRoute(blockOf26(srvIP), vtepB), vxlanRoute(blockOf26(cliIP), vtepA)
		}
		waitIPRoute(b, ha, mode+" route to b", toB)
		waitIPRoute(b, hb, mode+" route to a", toA)
	}
	measure := func(h *bgpHost, argv ...string) float64 {
		out, err := h.Docker(b, argv...)
		return iperfBPS(b, out, err)
	}
	for i := 0; i < b.N; i++ {
		var vx, dir, host []float64
		for range 5 {
			setMode("CrossSubnet")
			dir = append(dir, measure(ha, "exec", "cli", "iperf3", "-c", srvIP.String(), "-t", "3", "-J"))
			setMode("Always")
			vx = append(vx, measure(ha, "exec", "cli", "iperf3", "-c", srvIP.String(), "-t", "3", "-J"))
			out, err := ha.Exec(b, "iperf3", "-c", hb.IP.String(), "-t", "3", "-J")
			host = append(host, iperfBPS(b, out, err))
		}
		mv, md, mh := median(vx), median(dir), median(host)
		b.ReportMetric(mv/1e9, "vxlan-Gbit/s")
		b.ReportMetric(md/1e9, "direct-Gbit/s")
		b.ReportMetric(mh/1e9, "host-Gbit/s")
		b.ReportMetric(mv/md, "vxlan/direct")
		b.ReportMetric(mv/mh, "vxlan/host")
		verdict := "meets the target (>= 0.80x)"
		if mv/md < 0.80 {
			verdict = "MISSES the target (>= 0.80x)"
		}
		b.Logf("iperf3 container a -> container b, medians of 5: VXLAN %.2f Gbit/s, direct %.2f Gbit/s, host to host %.2f Gbit/s; VXLAN/direct %.2fx (%s), VXLAN/host %.2fx",
			mv/1e9, md/1e9, mh/1e9, mv/md, verdict, mv/mh)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
