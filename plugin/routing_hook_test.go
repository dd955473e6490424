package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/calico-cnm/calico-cnm/routing"
)

type fixedStatus struct{ st routing.Status }

func (f fixedStatus) Status(context.Context) routing.Status { return f.st }

func TestRoutingMetricsFollowAgentStatus(t *testing.T) {
	rm := RoutingMetrics{
		SessionsUp:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "up"}),
		RoutesInstalled: prometheus.NewGauge(prometheus.GaugeOpts{Name: "routes"}),
	}
	st := routing.Status{
		Peers: []routing.PeerStatus{{State: "Established"}, {State: "Active"}, {State: "Established"}},
		Routes: []routing.RouteStatus{{Dst: "192.168.1.0/26"}, {Dst: "192.168.2.0/26"},
			{Dst: "192.168.3.0/26"}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one pass, then return
	exportRoutingMetrics(ctx, fixedStatus{st}, rm, time.Hour)
	if got := testutil.ToFloat64(rm.SessionsUp); got != 2 {
		t.Errorf("sessions up = %v, want 2 (two Established of three)", got)
	}
	if got := testutil.ToFloat64(rm.RoutesInstalled); got != 3 {
		t.Errorf("routes installed = %v, want 3", got)
	}
	setRoutingMetrics(routing.Status{}, rm)
	if testutil.ToFloat64(rm.SessionsUp) != 0 || testutil.ToFloat64(rm.RoutesInstalled) != 0 {
		t.Error("gauges did not drop to 0 with no sessions and no routes")
	}
}

// /healthz's routes condition follows the agent's last route programming.
func TestRouteHealth(t *testing.T) {
	if err := routeHealth(routing.Status{}); err != nil {
		t.Errorf("routes programmed: %v", err)
	}
	err := routeHealth(routing.Status{RouteError: "netlink: operation not permitted"})
	if err == nil || !strings.Contains(err.Error(), "operation not permitted") {
		t.Errorf("failing routes: %v", err)
	}
}
