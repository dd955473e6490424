package plugin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/reconcile"
)

// Metric names, as the README documents them.
const (
	MetricAPIRequests    = "calico_cnm_api_requests_total"
	MetricAPILatency     = "calico_cnm_api_request_duration_seconds"
	MetricIPAMAllocated  = "calico_cnm_ipam_addresses_allocated"
	MetricIPAMFree       = "calico_cnm_ipam_addresses_free"
	MetricIPAMBlocks     = "calico_cnm_ipam_blocks"
	MetricIPAMUp         = "calico_cnm_ipam_up"
	MetricReconcileFixes = "calico_cnm_reconcile_fixes_total"
	MetricReconcileRuns  = "calico_cnm_reconcile_runs_total"
	// MetricReconcileScheduled is 1 while a reconcile pass other than the
	// periodic one is due (see reconcile.Metrics.PassScheduled).
	MetricReconcileScheduled = "calico_cnm_reconcile_pass_scheduled"
	MetricBGPSessionsUp      = "calico_cnm_bgp_sessions_up"
	MetricRoutesInstalled    = "calico_cnm_bgp_routes_installed"
	MetricShapedBytes        = "calico_cnm_bandwidth_shaped_bytes_total"
	MetricShapedDrops        = "calico_cnm_bandwidth_dropped_packets_total"
	ipamUsageCacheDuration   = 10 * time.Second
	ipamUsageTimeout         = 5 * time.Second
	healthPingTimeout        = 3 * time.Second
)

// RoutingMetrics are the gauges the BGP speaker keeps current. They are
// registered (at 0) whether or not BGP runs, so dashboards and alerts need
// no special case.
type RoutingMetrics struct {
	// SessionsUp is the number of BGP sessions in state Established.
	SessionsUp prometheus.Gauge
	// RoutesInstalled is the number of routes learnt over BGP that are in
	// the kernel.
	RoutesInstalled prometheus.Gauge
}

// Metrics is the daemon's Prometheus registry and the instruments the
// other parts update.
type Metrics struct {
	Registry *prometheus.Registry
	Routing  RoutingMetrics

	requests       *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	reconcileFixes *prometheus.CounterVec
	reconcileRuns  *prometheus.CounterVec
	reconcileDue   prometheus.Gauge
}

// IPAMStats is what the IPAM gauges are computed from (*ipam.Engine).
type IPAMStats interface {
	Usage(ctx context.Context) ([]ipam.BlockUsage, error)
	ListPools(ctx context.Context) ([]ipam.Pool, error)
}

// NewMetrics builds a registry with the API, reconcile, routing, IPAM (from
// stats, may be nil), Go runtime and process metrics.
func NewMetrics(stats IPAMStats, log logrus.FieldLogger) *Metrics {
	if log == nil {
		log = logrus.StandardLogger()
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Routing: RoutingMetrics{
			SessionsUp:      prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricBGPSessionsUp, Help: "BGP sessions in state Established."}),
			RoutesInstalled: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricRoutesInstalled, Help: "Routes learnt over BGP and installed in the kernel."}),
		},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricAPIRequests, Help: "Plugin API requests from Docker, by path and HTTP status code.",
		}, []string{"path", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricAPILatency, Help: "Time taken to answer plugin API requests, by path.",
			// Docker gives up on a plugin call after 15-30 s; the upper
			// buckets show requests that came close.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"path"}),
		reconcileFixes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricReconcileFixes, Help: "Repairs made by the reconcile loop, by kind.",
		}, []string{"kind"}),
		reconcileRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricReconcileRuns, Help: "Reconcile passes, by result.",
		}, []string{"result"}),
		reconcileDue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricReconcileScheduled, Help: "1 while a reconcile pass is due soon (after Docker events, or for maturing candidates), besides the periodic one.",
		}),
	}
	for _, k := range reconcile.FixKinds() {
		m.reconcileFixes.WithLabelValues(k)
	}
	for _, r := range reconcile.Results() {
		m.reconcileRuns.WithLabelValues(r)
	}
	m.Registry.MustRegister(
		m.Routing.SessionsUp, m.Routing.RoutesInstalled,
		m.requests, m.latency, m.reconcileFixes, m.reconcileRuns, m.reconcileDue,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if stats != nil {
		m.Registry.MustRegister(newIPAMCollector(stats, log))
	}
	return m
}

// ObserveRequest is the plugin Server's Observer.
func (m *Metrics) ObserveRequest(path string, code int, d time.Duration) {
	m.requests.WithLabelValues(path, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(path).Observe(d.Seconds())
}

// Fixed counts n repairs of one kind (nil-safe, so that the reconciler
// works without metrics).
func (m *Metrics) Fixed(kind string, n int) {
	if m != nil && n > 0 {
		m.reconcileFixes.WithLabelValues(kind).Add(float64(n))
	}
}

// ReconcileRun counts a pass (nil-safe).
func (m *Metrics) ReconcileRun(result string) {
	if m != nil {
		m.reconcileRuns.WithLabelValues(result).Inc()
	}
}

// PassScheduled sets the reconcile scheduled gauge (nil-safe).
func (m *Metrics) PassScheduled(scheduled bool) {
	if m == nil {
		return
	}
	v := 0.0
	if scheduled {
		v = 1
	}
	m.reconcileDue.Set(v)
}

// ipamCollector computes the IPAM gauges on scrape from one read of all
// blocks, cached briefly so that several scrapers (or a fast one) do not
// turn into an etcd load.
type ipamCollector struct {
	stats IPAMStats
	log   logrus.FieldLogger

	allocated, free, blocks, up *prometheus.Desc

	mu      sync.Mutex
	at      time.Time
	samples []prometheus.Metric
}

func newIPAMCollector(stats IPAMStats, log logrus.FieldLogger) *ipamCollector {
	return &ipamCollector{
		stats:     stats,
		log:       log,
		allocated: prometheus.NewDesc(MetricIPAMAllocated, "Addresses assigned, by IP pool.", []string{"pool"}, nil),
		free:      prometheus.NewDesc(MetricIPAMFree, "Addresses of the pool not assigned (in claimed blocks or not), by IP pool.", []string{"pool"}, nil),
		blocks:    prometheus.NewDesc(MetricIPAMBlocks, "Allocation blocks, by affine host (\"\" for none).", []string{"host"}, nil),
		up:        prometheus.NewDesc(MetricIPAMUp, "1 if the IPAM records could be read for this scrape.", nil, nil),
	}
}

func (c *ipamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.allocated
	ch <- c.free
	ch <- c.blocks
	ch <- c.up
}

func (c *ipamCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.samples == nil || time.Since(c.at) >= ipamUsageCacheDuration {
		samples, err := c.read()
		if err != nil {
			c.log.WithError(err).Warn("reading IPAM usage for metrics")
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
			c.samples = nil
			return
		}
		c.samples, c.at = samples, time.Now()
	}
	for _, s := range c.samples {
		ch <- s
	}
}

func (c *ipamCollector) read() ([]prometheus.Metric, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ipamUsageTimeout)
	defer cancel()
	pools, err := c.stats.ListPools(ctx)
	if err != nil {
		return nil, err
	}
	usage, err := c.stats.Usage(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]int{}
	perHost := map[string]int{}
	for _, u := range usage {
		used[u.Pool] += u.Used
		perHost[u.Host]++
	}
	out := []prometheus.Metric{prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)}
	for _, p := range pools {
		size := 0.0
		if pfx, err := netip.ParsePrefix(p.CIDR); err == nil {
			size = math.Exp2(float64(pfx.Addr().BitLen() - pfx.Bits()))
		}
		out = append(out,
			prometheus.MustNewConstMetric(c.allocated, prometheus.GaugeValue, float64(used[p.CIDR]), p.CIDR),
			prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, size-float64(used[p.CIDR]), p.CIDR))
	}
	for host, n := range perHost {
		out = append(out, prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(n), host))
	}
	return out, nil
}

// Health is what /healthz reports: healthy when the datastore answers, the
// plugin sockets are served and every Require'd condition holds (network
// policy and learned routes programmed).
type Health struct {
	ping func(ctx context.Context) error

	mu         sync.Mutex
	notServing string // "" when the sockets are served
	checks     []healthCheck
}

// healthCheck is one more condition of health (policy programmed, routes
// programmed): nil when fine.
type healthCheck struct {
	name  string
	check func() error
}

// Require makes /healthz red while check fails; name says what failed.
func (h *Health) Require(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, healthCheck{name: name, check: check})
}

// NewHealth checks the datastore with ping (store.Ping). Until SetServing
// is called the sockets count as not served yet.
func NewHealth(ping func(ctx context.Context) error) *Health {
	return &Health{ping: ping, notServing: "the plugin sockets are not served yet"}
}

// SetServing records whether the plugin sockets are served: nil when they
// are, otherwise why not.
func (h *Health) SetServing(why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if why == nil {
		h.notServing = ""
	} else {
		h.notServing = why.Error()
	}
}

// Check returns nil when healthy, else the reason.
func (h *Health) Check(ctx context.Context) error {
	h.mu.Lock()
	why := h.notServing
	checks := h.checks
	h.mu.Unlock()
	if why != "" {
		return errors.New(why)
	}
	for _, c := range checks {
		if err := c.check(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, healthPingTimeout)
	defer cancel()
	if err := h.ping(ctx); err != nil {
		return fmt.Errorf("the datastore does not answer: %w", err)
	}
	return nil
}

// ServeHTTP answers 200 "ok", or 503 with the reason.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := h.Check(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "unhealthy: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ok")
}

// MetricsHandler serves /metrics and /healthz.
func MetricsHandler(m *Metrics, h *Health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.Handle("/healthz", h)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "calico-cnm serves /metrics and /healthz here", http.StatusNotFound)
	})
	return mux
}

// CheckMetricsListen accepts "" (metrics off) or a loopback IP and port:
// metrics and health are unauthenticated, so they must not be reachable
// from other machines (a managed plugin shares the host's network).
func CheckMetricsListen(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics listen address %q is not host:port (e.g. 127.0.0.1:9091): %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("metrics listen address %q has an invalid port %q", addr, port)
	}
	ip, err := netip.ParseAddr(host)
	if host == "localhost" {
		return nil
	}
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("metrics listen address %q is not a loopback address: /metrics and /healthz are unauthenticated, use 127.0.0.1:PORT or [::1]:PORT", addr)
	}
	return nil
}

// ListenMetrics opens the metrics listener (on a loopback address only).
// Opening it before the rest of the daemon starts makes a taken port a
// startup error rather than a log line.
func ListenMetrics(addr string) (net.Listener, error) {
	if err := CheckMetricsListen(addr); err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, errors.New("metrics are off: no listen address")
	}
	host, port, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		// Do not let the resolver pick a non-loopback address.
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	return l, nil
}

// ServeMetrics serves h on l until ctx is done.
func ServeMetrics(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving metrics on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}
