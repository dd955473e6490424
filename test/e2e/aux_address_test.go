package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestAuxAddressReserved: an --aux-address stays reserved through several
// reconcile passes that each would release an unrecorded address older than
// the grace period (so it would be gone without its mark), and is free again
// after docker network rm.
func TestAuxAddressReserved(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, "aux", harness.HostOptions{})
	h.ImportBusybox(t)
	args := append(h.ServeArgs(nil), "--metrics-listen", reconcileMetricsAddr, "--reconcile-grace", "1s", "--resync-interval", "1s")
	p := h.StartPlugin(t, bin, nil, args...)
	ch := &calicoHost{Host: h, bin: bin, plugin: p}
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
		}
	})
	const aux = "192.168.0.200"
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "--aux-address", "router="+aux, "auxnet")

	runs := func() int {
		v, err := strconv.ParseFloat(ch.metricValue(t, `calico_cnm_reconcile_runs_total{result="ok"}`), 64)
		if err != nil {
			t.Fatal(err)
		}
		return int(v)
	}
	harness.Eventually(t, 20*time.Second, 200*time.Millisecond, "a first reconcile pass", func() error {
		out, err := ch.httpGet(t, "/metrics")
		if err != nil || !strings.Contains(out, `calico_cnm_reconcile_runs_total{result="ok"}`) {
			return fmt.Errorf("no ok pass yet (%v)", err)
		}
		return nil
	})
	start := runs()
	// Five passes at 1 s with a 1 s grace: an unmarked orphan would have
	// been released by the third.
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "five reconcile passes", func() error {
		if n := runs(); n < start+5 {
			return fmt.Errorf("%d passes so far", n-start)
		}
		return nil
	})
	out, err := h.Docker(t, "run", "--rm", "--net", "auxnet", "--ip", aux, harness.Image, "true")
	if err == nil || !strings.Contains(out+err.Error(), aux) {
		t.Errorf("docker run --ip %s (the aux address) after the reconcile passes: %v %s; want it refused as in use", aux, err, out)
	}

	h.MustDocker(t, "network", "rm", "auxnet")
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net2")
	h.MustDocker(t, "run", "--rm", "--net", "net2", "--ip", aux, harness.Image, "true")
}
