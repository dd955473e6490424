package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// BenchmarkMultiHostPublishedPort: requests per second of a busybox httpd
// through its published port (-p), from wrk on another netns host for 10 s,
// on a calico network (nftables DNAT) against Docker's bridge (its own DNAT;
// the harness runs dockerd with --userland-proxy=false) on the same dockerd
// in the same run. Named MultiHost so that make bench runs it with the
// other multi-host benchmarks.
func BenchmarkMultiHostPublishedPort(b *testing.B) {
	harness.RequirePrereqs(b)
	harness.RequireFile(b, "/usr/bin/wrk", "package wrk")
	bin := harness.BuildBinary(b)
	f := harness.NewFabric(b, "")
	h := f.AddHost(b, "pbench", harness.HostOptions{Bridge: true})
	h.ImportBusybox(b)
	h.StartPlugin(b, bin, nil, append(h.ServeArgs(nil), "--log-level", "info")...)
	client := f.AddHost(b, "pbenchc", harness.HostOptions{NoDockerd: true})
	h.MustDocker(b, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net1")
	serve := "echo hello > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"
	h.MustDocker(b, "run", "-d", "--name", "calico-web", "--net", "net1", "-p", "18080:8080", harness.Image, "sh", "-c", serve)
	h.MustDocker(b, "run", "-d", "--name", "bridge-web", "--net", "bridge", "-p", "18081:8080", harness.Image, "sh", "-c", serve)
	for _, port := range []string{"18080", "18081"} {
		url := fmt.Sprintf("http://%s:%s/", h.IP, port)
		harness.Eventually(b, 15*time.Second, 200*time.Millisecond, url+" answers", func() error {
			out, err := client.Exec(b, "curl", "-sS", "-m", "2", url)
			if err != nil || !strings.Contains(out, "hello") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	reqs := regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	rate := func(port string) float64 {
		out, err := client.Exec(b, "wrk", "-t", "2", "-c", "16", "-d", "10s", fmt.Sprintf("http://%s:%s/", h.IP, port))
		m := reqs.FindStringSubmatch(out)
		if err != nil || m == nil {
			b.Fatalf("wrk: %v\n%s", err, out)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	for i := 0; i < b.N; i++ {
		calico := rate("18080")
		bridge := rate("18081")
		b.ReportMetric(calico, "calico-req/s")
		b.ReportMetric(bridge, "bridge-req/s")
		b.ReportMetric(calico/bridge, "ratio")
		b.Logf("published port, busybox httpd, wrk 10 s: calico %.0f req/s, bridge %.0f req/s, ratio %.2f", calico, bridge, calico/bridge)
	}
}
