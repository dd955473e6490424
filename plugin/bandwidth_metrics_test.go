package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/bandwidth"
)

type fixedStats struct {
	stats []bandwidth.Stat
	err   error
}

func (f fixedStats) Stats(ctx context.Context) ([]bandwidth.Stat, error) { return f.stats, f.err }

// TestBandwidthCollector: /metrics has the shaped bytes and drops of each
// endpoint and direction, and nothing (not a failed scrape) when the
// kernel cannot be read.
func TestBandwidthCollector(t *testing.T) {
	ep := strings.Repeat("ab", 32)
	c := newBandwidthCollector(fixedStats{stats: []bandwidth.Stat{
		{EndpointID: ep, Direction: bandwidth.DirIngress, Counters: bandwidth.Counters{Bytes: 1500, Drops: 3}},
		{EndpointID: ep, Direction: bandwidth.DirEgress, Counters: bandwidth.Counters{Bytes: 700}},
	}}, logrus.New())
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP calico_cnm_bandwidth_dropped_packets_total Packets an endpoint's bandwidth limit dropped, by endpoint and direction.
# TYPE calico_cnm_bandwidth_dropped_packets_total counter
calico_cnm_bandwidth_dropped_packets_total{direction="egress",endpoint="abababababab"} 0
calico_cnm_bandwidth_dropped_packets_total{direction="ingress",endpoint="abababababab"} 3
# HELP calico_cnm_bandwidth_shaped_bytes_total Bytes sent through an endpoint's bandwidth limit, by endpoint and direction (ingress: into the container).
# TYPE calico_cnm_bandwidth_shaped_bytes_total counter
calico_cnm_bandwidth_shaped_bytes_total{direction="egress",endpoint="abababababab"} 700
calico_cnm_bandwidth_shaped_bytes_total{direction="ingress",endpoint="abababababab"} 1500
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricShapedBytes, MetricShapedDrops); err != nil {
		t.Error(err)
	}
	broken := prometheus.NewRegistry()
	broken.MustRegister(newBandwidthCollector(fixedStats{err: errors.New("injected")}, logrus.New()))
	if n, err := testutil.GatherAndCount(broken); err != nil || n != 0 {
		t.Errorf("unreadable kernel: %d samples, %v", n, err)
	}
}
