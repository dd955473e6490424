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

// TestIdleQuietAndCheap: with 100 containers and 10 policies, over 60 s
// idle (the resync interval longer than that), the daemon sends etcd no
// Range request, uses under 1% of a core and logs nothing at warning or
// above; nor does it log a warning while it starts or stops cleanly. (The
// busy minutes of starting 100 containers are neither idle nor start-up: a
// loaded machine's etcd may rightly warn of a slow disk then.)
func TestIdleQuietAndCheap(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, "idle", harness.HostOptions{})
	h.ImportBusybox(t)
	args := h.ServeArgs(nil)
	i := slices.Index(args, "--log-level")
	if i < 0 {
		t.Fatalf("serve arguments %v carry no --log-level", args)
	}
	args[i+1] = "info"
	p := h.StartPlugin(t, bin, nil, append(args, "--resync-interval", idleResync.String(), "--metrics-listen", harness.IdleDaemonMetrics)...)
	startLog := p.Log()
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
		}
	})
	h.StartIdleLoad(t, bin, idleContainers, idlePolicies)

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

	for _, w := range harness.WarningLines(startLog) {
		t.Errorf("logged while starting: %s", w)
	}
	stopFrom := len(p.Log())
	stopCleanly(t, p)
	for _, w := range harness.WarningLines(p.Log()[stopFrom:]) {
		t.Errorf("logged while stopping cleanly: %s", w)
	}
	// The harness removes the containers at cleanup through Docker, which
	// calls the daemon for each: against a stopped one Docker retries every
	// call for 30 s and the removal runs out of time, leaving dockerd to
	// stop 100 running containers.
	p.Start(t)
}
