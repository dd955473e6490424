package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// firstConnectionBatch is how many containers start at once.
const firstConnectionBatch = 10

// BenchmarkMultiHostFirstConnection: 10 labelled containers started at
// the same instant (parallel `docker run -d`), each connecting to a server
// a policy allows them as its first instruction, with a 1 s connect
// timeout (a first SYN that is dropped waits 1 s for its retransmit, so
// it fails). 3 rounds; reports the share that succeeded (target 100%).
func BenchmarkMultiHostFirstConnection(b *testing.B) {
	harness.RequirePrereqs(b)
	c := &bgpCluster{bin: harness.BuildBinary(b), fabric: harness.NewFabric(b, "")}
	c.etcd = c.fabric.StartEtcd(b)
	if out, err := mhRun(context.Background(), c.bin, "pool", "add", mhPool, "--etcd-endpoints", c.etcd); err != nil {
		b.Fatalf("pool add: %v\n%s", err, out)
	}
	h := c.addHostOn(b, c.fabric, "a", "--log-level", "info")
	h.MustDocker(b, "run", "-d", "--name", "srv", "--net", mhNetwork, "--label", policyLabel+"srv", harness.Image, "nc", "-ll", "-p", "80", "-e", "echo", "srv")
	doc := "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: first}\nspec:\n  selector: role == 'srv'\n  types: [Ingress]\n  ingress:\n" +
		"  - {action: Allow, protocol: TCP, source: {selector: \"role == 'client'\"}, destination: {ports: [80]}}\n"
	file := filepath.Join(b.TempDir(), "first.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	c.mustCtl(b, "apply", "-f", file)
	harness.Eventually(b, 10*time.Second, 50*time.Millisecond, "the policy is in the kernel", func() error {
		if out, err := h.Exec(b, "nft", "list", "ruleset"); err != nil || !strings.Contains(out, "first ingress rule") {
			return fmt.Errorf("no rule of policy first yet")
		}
		return nil
	})
	const rounds = 3
	seq := 0
	for i := 0; i < b.N; i++ {
		ok, total := 0, 0
		for r := 0; r < rounds; r++ {
			var names []string
			for k := 0; k < firstConnectionBatch; k++ {
				seq++
				names = append(names, fmt.Sprintf("fc%d", seq))
			}
			var wg sync.WaitGroup
			for _, n := range names {
				wg.Add(1)
				go func() {
					defer wg.Done()
					h.MustDocker(b, "run", "-d", "--name", n, "--net", mhNetwork, "--label", policyLabel+"client", harness.Image,
						"sh", "-c", "if nc -w 1 srv 80 </dev/null | grep -q srv; then echo first-ok; else echo first-fail; fi; exec sleep 3600")
				}()
			}
			wg.Wait()
			for _, n := range names {
				var out string
				harness.Eventually(b, 30*time.Second, 100*time.Millisecond, n+" reported", func() error {
					out, _ = h.Docker(b, "logs", n)
					if !strings.Contains(out, "first-") {
						return fmt.Errorf("no result yet")
					}
					return nil
				})
				total++
				if strings.Contains(out, "first-ok") {
					ok++
				}
			}
			h.MustDocker(b, append([]string{"rm", "-f"}, names...)...)
		}
		share := 100 * float64(ok) / float64(total)
		b.ReportMetric(share, "first-SYN-%")
		b.Logf("%d containers started together, %d rounds: %d of %d first connections succeeded on the first SYN (%.0f%%, target 100%%)", firstConnectionBatch, rounds, ok, total, share)
	}
}
