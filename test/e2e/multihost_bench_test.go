package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// Benchmarks of the multi-host data plane (make bench; run with
// -benchtime=1x: one iteration already does 50 trials or a 5 s transfer).

// newBenchCluster is newBGPCluster for a benchmark: two hosts a and b.
func newBenchCluster(b *testing.B) (*bgpCluster, *bgpHost, *bgpHost) {
	b.Helper()
	harness.RequirePrereqs(b)
	c := &bgpCluster{bin: harness.BuildBinary(b), fabric: harness.NewFabric(b, "")}
	c.etcd = c.fabric.StartEtcd(b)
	out, err := mhRun(context.Background(), c.bin, "pool", "add", mhPool, "--etcd-endpoints", c.etcd)
	if err != nil {
		b.Fatalf("pool add: %v\n%s", err, out)
	}
	return c, c.addHostTB(b, "a", "--log-level", "info"), c.addHostTB(b, "b", "--log-level", "info")
}

// BenchmarkMultiHostBlockConvergence: a block claimed for host a (through
// IPAM, as a container start would) until b's kernel has the route via a;
// 50 trials, each followed by the release and withdrawal. Reports p50/p99.
func BenchmarkMultiHostBlockConvergence(b *testing.B) {
	c, ha, hb := newBenchCluster(b)
	ctx := context.Background()
	store := c.openStore(b)
	quiet := logrus.New()
	quiet.SetLevel(logrus.WarnLevel)
	eng := ipam.New(store, ipam.Options{ReleaseGracePeriod: ipam.ReleaseImmediately, Log: quiet})

	ns, err := netns.GetFromPath(hb.NetnsPath)
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	updates := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: &ns}); err != nil {
		b.Fatal(err)
	}
	// wait for b to see (or stop seeing) dst via a, from the event stream.
	wait := func(dst string, present bool, timeout time.Duration) error {
		deadline := time.After(timeout)
		for {
			select {
			case u := <-updates:
				if u.Protocol != routing.LearnedProtocol || u.Dst == nil || u.Dst.String() != dst {
					continue
				}
				if present && u.Type == 24 /* RTM_NEWROUTE */ && u.Gw.Equal(ha.IP) {
					return nil
				}
				if !present && u.Type == 25 /* RTM_DELROUTE */ {
					return nil
				}
			case <-deadline:
				return fmt.Errorf("route %s present=%v not seen on b within %s", dst, present, timeout)
			}
		}
	}
	// Measure steady state: the session must be up before the first claim.
	ha.waitPeers(b, map[string]routing.PeerType{hb.IP.String(): routing.PeerMesh}, 30*time.Second)
	hb.waitPeers(b, map[string]routing.PeerType{ha.IP.String(): routing.PeerMesh}, 30*time.Second)
	_, pool, _ := net.ParseCIDR(mhPool)
	const trials = 50
	for i := 0; i < b.N; i++ {
		var lat, withdraw []time.Duration
		for trial := 0; trial < trials; trial++ {
			handle := fmt.Sprintf("bench.%d.%d", i, trial)
			start := time.Now()
			ip, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: ha.Name, HandleID: handle, Within: pool})
			if err != nil {
				b.Fatal(err)
			}
			blk := blockOf26(ip.IP)
			if err := wait(blk, true, 20*time.Second); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			start = time.Now()
			if err := eng.ReleaseByHandle(ctx, handle); err != nil {
				b.Fatal(err)
			}
			if err := wait(blk, false, 20*time.Second); err != nil {
				b.Fatal(err)
			}
			withdraw = append(withdraw, time.Since(start))
		}
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(percentile(withdraw, 50).Microseconds())/1000, "withdraw-p50-ms")
		b.Logf("block claimed on a -> route in b's kernel, %d trials: p50 %s p99 %s max %s; release -> route gone: p50 %s p99 %s",
			trials, p50, p99, slices.Max(lat), percentile(withdraw, 50), percentile(withdraw, 99))
	}
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// BenchmarkMultiHostIperf: TCP throughput container-on-a -> container-on-b
// over the BGP-learned routes, against host a -> host b on the same fabric.
func BenchmarkMultiHostIperf(b *testing.B) {
	harness.RequireFile(b, "/usr/bin/iperf3", "package iperf3")
	_, ha, hb := newBenchCluster(b)
	const img = "iperf"
	for _, h := range []*bgpHost{ha, hb} {
		h.ImportImage(b, img, "/usr/bin/iperf3")
	}
	hb.MustDocker(b, "run", "-d", "--name", "srv", "--net", mhNetwork, img, "iperf3", "-s")
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	srvIP := strings.TrimSpace(hb.MustDocker(b, "inspect", "-f", tmpl, "srv"))
	ha.MustDocker(b, "run", "-d", "--name", "cli", "--net", mhNetwork, img, "sleep", "3600")
	harness.Eventually(b, 30*time.Second, 200*time.Millisecond, "route to the server's block on a", func() error {
		if !learnedRoute(blockOf26(net.ParseIP(srvIP)), hb.IP).MatchString(ha.MustExec(b, "ip", "-4", "route")) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	hb.StartProcess(b, "iperf3-host", nil, harness.TCPReady(hb.IP.String()+":5201"), "/usr/bin/iperf3", "-s", "-B", hb.IP.String())

	bps := func(out string, err error) float64 { return iperfBPS(b, out, err) }
	for i := 0; i < b.N; i++ {
		ctr := bps(ha.Docker(b, "exec", "cli", "iperf3", "-c", srvIP, "-t", "5", "-J"))
		host := bps(ha.Exec(b, "iperf3", "-c", hb.IP.String(), "-t", "5", "-J"))
		b.ReportMetric(ctr/1e9, "container-Gbit/s")
		b.ReportMetric(host/1e9, "host-Gbit/s")
		b.ReportMetric(ctr/host, "ratio")
		b.Logf("iperf3 container a -> container b: %.2f Gbit/s; host a -> host b: %.2f Gbit/s; ratio %.2f", ctr/1e9, host/1e9, ctr/host)
	}
}
