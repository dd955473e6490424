package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
)

// bandwidthNetlinkTimeout bounds each netlink request of the shaper: a
// wedged kernel call must fail a Join, not hang it.
const bandwidthNetlinkTimeout = 10 * time.Second

// newBandwidth makes the shaper of this host's endpoints (package
// bandwidth) over its own netlink socket in the host namespace; close
// releases the socket (the shaping stays in the kernel).
func newBandwidth(cfg Config, records datastore.Records, engineID func() string, log logrus.FieldLogger) (m *bandwidth.Manager, close func(), err error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, fmt.Errorf("bandwidth limits: opening netlink: %w", err)
	}
	if err := h.SetSocketTimeout(bandwidthNetlinkTimeout); err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("bandwidth limits: setting the netlink timeout: %w", err)
	}
	return bandwidth.NewManager(records, cfg.NodeName, bandwidth.NewShaper(h), engineID, log), h.Close, nil
}

// startBandwidth follows the datastore (network defaults changed, labels
// learnt after Join) under sup. The reconcile pass does the periodic
// repair (reconcile.Reconciler.Shaping).
func startBandwidth(sup *supervisor, m *bandwidth.Manager) {
	sup.Service("bandwidth limits", func(ctx context.Context) error {
		m.Run(ctx)
		return ctx.Err()
	})
}

// bandwidthStats is what the shaping metrics are read from
// (*bandwidth.Manager).
type bandwidthStats interface {
	Stats(ctx context.Context) ([]bandwidth.Stat, error)
}

// bandwidthCollector reads the shaping counters of each endpoint from the
// kernel on scrape.
type bandwidthCollector struct {
	stats        bandwidthStats
	log          logrus.FieldLogger
	bytes, drops *prometheus.Desc
}

func newBandwidthCollector(stats bandwidthStats, log logrus.FieldLogger) *bandwidthCollector {
	labels := []string{"endpoint", "direction"}
	return &bandwidthCollector{
		stats: stats,
		log:   log,
		bytes: prometheus.NewDesc(MetricShapedBytes, "Bytes sent through an endpoint's bandwidth limit, by endpoint and direction (ingress: into the container).", labels, nil),
		drops: prometheus.NewDesc(MetricShapedDrops, "Packets an endpoint's bandwidth limit dropped, by endpoint and direction.", labels, nil),
	}
}

func (c *bandwidthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.bytes
	ch <- c.drops
}

func (c *bandwidthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ipamUsageTimeout)
	defer cancel()
	stats, err := c.stats.Stats(ctx)
	if err != nil {
		c.log.WithError(err).Warn("reading bandwidth shaping counters for metrics")
		return
	}
	for _, s := range stats {
		ep := dataplane.ShortID(s.EndpointID)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.Bytes), ep, s.Direction)
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(s.Drops), ep, s.Direction)
	}
}
