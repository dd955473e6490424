package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// Idle scenario sizes and bounds (issue 20 item 6).
const (
	idleContainers = 100
	idlePolicies   = 10
	idleWindow     = 60 * time.Second
	// idleResync is longer than the settling and the window together, so
	// no periodic resync pass (which may list) falls in the window.
	idleResync = 30 * time.Minute
	// idleCPUPercent is the most CPU, in % of one core, the daemon may use
	// over the window.
	idleCPUPercent = 1.0
)

// idleReads are the etcd methods that read the datastore: a List or a Get
// is a Range, and a Txn only reads as part of a write.
var idleReads = []string{"Range"}

// idleServeArgs are the daemon's arguments for the idle scenario on h: the
// default ones at log level info (the window counts warning lines, and a
// debug log is not what an operator runs), a resync interval longer than
// the scenario, and /metrics where AwaitIdleSettled reads it.
func idleServeArgs(t *testing.T, h *harness.Host) []string {
	t.Helper()
	args := h.ServeArgs(nil)
	i := slices.Index(args, "--log-level")
	if i < 0 {
		t.Fatalf("serve arguments %v carry no --log-level", args)
	}
	args[i+1] = "info"
	return append(args, "--resync-interval", idleResync.String(), "--metrics-listen", harness.IdleDaemonMetrics)
}

// assertIdleQuietAndCheap: with the scenario's containers and policies in
// place on h, over idleWindow idle (the resync interval longer than that),
// the daemon p sends etcd no Range request, uses under 1% of a core and
// logs nothing at warning or above.
func assertIdleQuietAndCheap(t *testing.T, h *harness.Host, p *harness.Process) {
	t.Helper()
	f := h.MeasureIdle(t, p, idleWindow)
	t.Logf("idle with %d containers and %d policies %s", idleContainers, idlePolicies, f)
	for _, m := range idleReads {
		if f.Before[m] == 0 {
			t.Fatalf("etcd counted no %s request before the window, when the daemon read its state: is the counter read? (%v)", m, f.Before)
		}
		if n := f.Requests[m]; n > 0 {
			t.Errorf("%v %s requests to etcd over %s idle, want none outside the resync (every %s)", n, m, f.Window, idleResync)
		}
	}
	if c := f.CPUPercent(); c >= idleCPUPercent {
		t.Errorf("daemon CPU %.2f%% of a core over %s idle, want under %.0f%%", c, f.Window, idleCPUPercent)
	}
	for _, w := range f.Warnings {
		t.Errorf("logged while idle: %s", w)
	}
}
