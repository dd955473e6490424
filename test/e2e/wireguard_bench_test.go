package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// BenchmarkMultiHostWireGuardIperf: TCP throughput of one container pair
// on two hosts (BGP), in clear and through WireGuard (userspace here: the
// kernel has no module), 3 rounds each measuring both in turn, medians
// reported with the ratio encrypted/clear, and the CPU seconds per GB
// transferred: the whole machine's (/proc/stat, both hosts' kernels and
// daemons) and, encrypted, the two daemons' own (wireguard-go). With perf
// installed, one encrypted run is profiled on the receiving daemon and the
// top symbols logged: they say what bounds the userspace path.
func BenchmarkMultiHostWireGuardIperf(b *testing.B) {
	harness.RequireFile(b, "/usr/bin/iperf3", "package iperf3")
	harness.RequirePrereqs(b)
	c := &bgpCluster{bin: harness.BuildBinary(b), fabric: harness.NewFabric(b, "")}
	c.etcd = c.fabric.StartEtcd(b)
	c.mustCtl(b, "pool", "add", mhPool)
	ha := c.addHostTB(b, "a", "--log-level", "info")
	hb := c.addHostTB(b, "b", "--log-level", "info")
	c.mustCtl(b, "cluster", "set", "--wireguard", "on")
	waitWGPeers(b, ha, []string{"b"}, nil)
	waitWGPeers(b, hb, []string{"a"}, nil)
	// Created while on: both modes run with the encrypted MTU (1440).
	_, srvIP := iperfPair(b, ha, "cli", hb, "srv")
	block := blockOf26(srvIP)

	setWG := func(on bool) {
		c.mustCtl(b, "cluster", "set", "--wireguard", map[bool]string{true: "on", false: "off"}[on])
		harness.Eventually(b, 30*time.Second, 200*time.Millisecond, "WireGuard route switched", func() error {
			out := ha.MustExec(b, "ip", "route", "show", "table", "99")
			if wgRoute(block).MatchString(out) != on {
				return fmt.Errorf("table 99 on a:\n%s", out)
			}
			return nil
		})
		harness.Eventually(b, 20*time.Second, 200*time.Millisecond, "ping through", func() error {
			_, err := ha.Docker(b, "exec", "cli", "ping", "-c", "1", "-W", "1", srvIP.String())
			return err
		})
	}
	daemons := []int{ha.plugin.Pid(), hb.plugin.Pid()}
	type run struct{ bps, gb, cpu, daemonCPU float64 }
	measure := func() run {
		cpu0, d0 := machineCPU(b), processCPU(b, daemons...)
		out, err := ha.Docker(b, "exec", "cli", "iperf3", "-c", srvIP.String(), "-t", "3", "-J")
		cpu1, d1 := machineCPU(b), processCPU(b, daemons...)
		bps := iperfBPS(b, out, err)
		gb := float64(iperfBytes(b, out)) / 1e9
		return run{bps: bps, gb: gb, cpu: (cpu1 - cpu0) / gb, daemonCPU: (d1 - d0) / gb}
	}
	for i := 0; i < b.N; i++ {
		var clear, wg, clearCPU, wgCPU, wgDaemon []float64
		for range 3 {
			setWG(false)
			r := measure()
			clear, clearCPU = append(clear, r.bps), append(clearCPU, r.cpu)
			setWG(true)
			r = measure()
			wg, wgCPU, wgDaemon = append(wg, r.bps), append(wgCPU, r.cpu), append(wgDaemon, r.daemonCPU)
		}
		mc, mw := median(clear), median(wg)
		b.ReportMetric(mw/1e9, "wireguard-Gbit/s")
		b.ReportMetric(mc/1e9, "clear-Gbit/s")
		b.ReportMetric(mw/mc, "wireguard/clear")
		b.ReportMetric(median(wgCPU), "wireguard-cpu-s/GB")
		b.ReportMetric(median(clearCPU), "clear-cpu-s/GB")
		b.ReportMetric(median(wgDaemon), "wireguard-daemon-cpu-s/GB")
		b.Logf("iperf3 container a -> container b, medians of 3: WireGuard (userspace) %.3f Gbit/s, clear %.3f Gbit/s, ratio %.3fx; CPU seconds per GB: WireGuard %.2f (daemons %.2f), clear %.2f",
			mw/1e9, mc/1e9, mw/mc, median(wgCPU), median(wgDaemon), median(clearCPU))
	}
	if _, err := os.Stat("/usr/bin/perf"); err == nil {
		profileWireGuard(b, ha, hb, srvIP.String())
	}
}

// profileWireGuard records the receiving daemon during an encrypted
// iperf3 run and logs its top symbols.
func profileWireGuard(b *testing.B, ha, hb *bgpHost, srv string) {
	data := b.TempDir() + "/perf.data"
	rec := exec.Command("perf", "record", "-F", "499", "-g", "-o", data, "-p", strconv.Itoa(hb.plugin.Pid()), "--", "sleep", "3")
	if err := rec.Start(); err != nil {
		b.Logf("perf record: %v", err)
		return
	}
	out, err := ha.Docker(b, "exec", "cli", "iperf3", "-c", srv, "-t", "4", "-J")
	_ = iperfBPS(b, out, err)
	if err := rec.Wait(); err != nil {
		b.Logf("perf record: %v", err)
		return
	}
	rep, err := exec.Command("perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "symbol", "-g", "none", "--percent-limit", "2").Output()
	if err != nil {
		b.Logf("perf report: %v", err)
		return
	}
	var top []string
	for _, l := range strings.Split(string(rep), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && strings.HasSuffix(f[0], "%") && strings.HasPrefix(f[1], "[") && len(top) < 10 {
			top = append(top, f[0]+" "+f[2])
		}
	}
	// On stderr too: go test keeps only the first lines of a benchmark's log.
	msg := "receiving daemon's profile (wireguard-go), symbols over 2%: " + strings.Join(top, "; ")
	b.Log(msg)
	fmt.Fprintln(os.Stderr, msg)
}

// machineCPU is the CPU time (s) the machine spent busy since boot.
func machineCPU(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	busy := 0.0
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100 // USER_HZ
}

// processCPU is the user+system CPU time (s) of the processes.
func processCPU(tb testing.TB, pids ...int) float64 {
	total := 0.0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			tb.Fatal(err)
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		total += (ut + st) / 100
	}
	return total
}

// iperfBytes is the bytes received in an iperf3 -J run.
func iperfBytes(tb testing.TB, out string) int64 {
	var r struct {
		End struct {
			SumReceived struct {
				Bytes int64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.End.SumReceived.Bytes == 0 {
		tb.Fatalf("iperf3 -J output: %v\n%s", err, out)
	}
	return r.End.SumReceived.Bytes
}
