package bench

import (
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// The idle row (issue 20 item 6): a host with idleContainers containers
// and idlePolicies policies, left alone for idleWindow, its resync interval
// longer than that.
const (
	idleContainers = 100
	idlePolicies   = 10
	idleWindow     = 60 * time.Second
	idleResync     = 30 * time.Minute
	// PlotIdle is the idle row's plot: datastore requests per minute by
	// kind (Range with its target of 0), CPU and warning lines.
	PlotIdle = "idle 60 s with 100 containers"
	// TargetIdleCPU is the most daemon CPU, in % of one core, at idle.
	TargetIdleCPU = 1.0
)

// idleBench measures, on a host of its own on fab, what the daemon does
// while nothing happens: etcd requests per minute by gRPC method (Range
// must be 0: no read outside the resync), its CPU in % of a core (under
// 1%) and its log lines at warning or above (0).
func idleBench(t *testing.T, fab *harness.Fabric, bin string, res *Results) {
	h := fab.AddHost(t, "idle", harness.HostOptions{})
	h.ImportBusybox(t)
	args := h.ServeArgs(nil)
	if i := slices.Index(args, "--log-level"); i >= 0 {
		args[i+1] = "info"
	}
	p := h.StartPlugin(t, bin, nil, append(args, "--resync-interval", idleResync.String(), "--metrics-listen", harness.IdleDaemonMetrics)...)
	h.StartIdleLoad(t, bin, idleContainers, idlePolicies)
	f := h.MeasureIdle(t, p, idleWindow)
	t.Logf("idle: %s", f)
	addIdle(res, f)
}

// addIdle adds the idle figures: Range requests per minute (target 0),
// every other gRPC method's per minute, CPU % (target TargetIdleCPU) and
// warning lines (target 0).
func addIdle(res *Results, f harness.IdleFigures) {
	res.Add(Series{Plot: PlotIdle, Name: "Range requests", YLabel: "/min", Y: []float64{f.PerMinute("Range")}, Kind: Bars, ZeroTarget: true})
	var methods []string
	for m := range f.Requests {
		if m != "Range" {
			methods = append(methods, m)
		}
	}
	sort.Strings(methods)
	for _, m := range methods {
		res.AddValue(PlotIdle, m+" requests", "/min", f.PerMinute(m))
	}
	res.Add(Series{Plot: PlotIdle + " (CPU)", Name: "daemon CPU", YLabel: "% of a core", Y: []float64{f.CPUPercent()}, Kind: Bars, Target: TargetIdleCPU})
	res.Add(Series{Plot: PlotIdle + " (log)", Name: "warning lines", YLabel: "lines", Y: []float64{float64(len(f.Warnings))}, Kind: Bars, ZeroTarget: true})
}
