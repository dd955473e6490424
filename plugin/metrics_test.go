package plugin_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetricsAndHealth(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	engine := ipam.New(m.Store, ipam.Options{Log: quietLog()})
	for _, p := range []string{"10.30.0.0/16", "fd00:30::/64"} {
		if _, err := engine.AddPool(ctx, ipam.Pool{CIDR: p}); err != nil {
			t.Fatal(err)
		}
	}
	// host-a: 3 addresses in one block; host-b: 1 address (its own block).
	for i, h := range []string{host, host, host, "host-b"} {
		if _, err := engine.AutoAssign(ctx, ipam.AutoAssignArgs{Host: h, HandleID: "cnm.m" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	metrics := plugin.NewMetrics(engine, quietLog())
	health := plugin.NewHealth(m.Store.Ping)

	// Requests through a real plugin server, as Docker makes them.
	nd := driver.NewNetworkDriver(m.Store, drivertest.NewDataplane(), host, quietLog(), driver.Options{})
	srv := plugin.NewServer(nd, driver.NewIPAMDriver(drivertest.NewIPAM(), host, quietLog()), quietLog())
	srv.Observer = metrics.ObserveRequest
	api := httptest.NewServer(srv.Handler("NetworkDriver", "IpamDriver"))
	t.Cleanup(api.Close)
	for i := 0; i < 2; i++ {
		post(t, api.URL, "/NetworkDriver.GetCapabilities", nil)
	}
	post(t, api.URL, "/NetworkDriver.Join", `{"EndpointID":"nope"}`) // an error (500): not a known endpoint

	ts := httptest.NewServer(plugin.MetricsHandler(metrics, health))
	t.Cleanup(ts.Close)

	t.Run("metrics", func(t *testing.T) {
		code, body := get(t, ts.URL+"/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d %s", code, body)
		}
		want := `
# HELP calico_cnm_api_requests_total Plugin API requests from Docker, by path and HTTP status code.
# TYPE calico_cnm_api_requests_total counter
calico_cnm_api_requests_total{code="200",path="/NetworkDriver.GetCapabilities"} 2
calico_cnm_api_requests_total{code="500",path="/NetworkDriver.Join"} 1
# HELP calico_cnm_ipam_addresses_allocated Addresses assigned, by IP pool.
# TYPE calico_cnm_ipam_addresses_allocated gauge
calico_cnm_ipam_addresses_allocated{pool="10.30.0.0/16"} 4
calico_cnm_ipam_addresses_allocated{pool="fd00:30::/64"} 0
# HELP calico_cnm_ipam_addresses_free Addresses of the pool not assigned (in claimed blocks or not), by IP pool.
# TYPE calico_cnm_ipam_addresses_free gauge
calico_cnm_ipam_addresses_free{pool="10.30.0.0/16"} 65532
calico_cnm_ipam_addresses_free{pool="fd00:30::/64"} 1.8446744073709552e+19
# HELP calico_cnm_ipam_blocks Allocation blocks, by affine host ("" for none).
# TYPE calico_cnm_ipam_blocks gauge
calico_cnm_ipam_blocks{host="host-a"} 1
calico_cnm_ipam_blocks{host="host-b"} 1
# HELP calico_cnm_ipam_up 1 if the IPAM records could be read for this scrape.
# TYPE calico_cnm_ipam_up gauge
calico_cnm_ipam_up 1
# HELP calico_cnm_bgp_sessions_up BGP sessions in state Established.
# TYPE calico_cnm_bgp_sessions_up gauge
calico_cnm_bgp_sessions_up 0
# HELP calico_cnm_bgp_routes_installed Routes learnt over BGP and installed in the kernel.
# TYPE calico_cnm_bgp_routes_installed gauge
calico_cnm_bgp_routes_installed 0
# HELP calico_cnm_reconcile_fixes_total Repairs made by the reconcile loop, by kind.
# TYPE calico_cnm_reconcile_fixes_total counter
calico_cnm_reconcile_fixes_total{kind="address_reclaimed"} 0
calico_cnm_reconcile_fixes_total{kind="address_released"} 0
calico_cnm_reconcile_fixes_total{kind="endpoint_rebuilt"} 0
calico_cnm_reconcile_fixes_total{kind="endpoint_removed"} 0
calico_cnm_reconcile_fixes_total{kind="interface_removed"} 0
calico_cnm_reconcile_fixes_total{kind="orphan_released"} 0
calico_cnm_reconcile_fixes_total{kind="route_restored"} 0
calico_cnm_reconcile_fixes_total{kind="shaping_repaired"} 0
`
		if err := testutil.ScrapeAndCompare(ts.URL+"/metrics", strings.NewReader(want),
			plugin.MetricAPIRequests, plugin.MetricIPAMAllocated, plugin.MetricIPAMFree, plugin.MetricIPAMBlocks, plugin.MetricIPAMUp,
			plugin.MetricBGPSessionsUp, plugin.MetricRoutesInstalled, plugin.MetricReconcileFixes); err != nil {
			t.Error(err)
		}
		for _, s := range []string{
			`calico_cnm_api_request_duration_seconds_count{path="/NetworkDriver.GetCapabilities"} 2`,
			"go_goroutines ", "process_open_fds ",
		} {
			if !strings.Contains(body, s) {
				t.Errorf("/metrics lacks %q", s)
			}
		}
		// The routing engineer's gauges are live instruments.
		metrics.Routing.SessionsUp.Set(2)
		if v := testutil.ToFloat64(metrics.Routing.SessionsUp); v != 2 {
			t.Errorf("sessions up gauge = %v", v)
		}
	})

	t.Run("healthz", func(t *testing.T) {
		code, body := get(t, ts.URL+"/healthz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "not served yet") {
			t.Errorf("before the sockets are served: %d %q", code, body)
		}
		health.SetServing(nil)
		if code, body := get(t, ts.URL+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Errorf("healthy daemon: %d %q", code, body)
		}
		if err := m.Store.Close(); err != nil {
			t.Fatal(err)
		}
		code, body = get(t, ts.URL+"/healthz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "datastore") {
			t.Errorf("after the store was closed: %d %q", code, body)
		}
	})

	t.Run("ipam gauges vanish when the store is unreadable", func(t *testing.T) {
		// A fresh registry (no cached sample) on the closed store.
		fresh := httptest.NewServer(plugin.MetricsHandler(plugin.NewMetrics(engine, quietLog()), health))
		t.Cleanup(fresh.Close)
		code, body := get(t, fresh.URL+"/metrics")
		if code != 200 || !strings.Contains(body, "\ncalico_cnm_ipam_up 0\n") || strings.Contains(body, plugin.MetricIPAMAllocated+"{") {
			t.Errorf("/metrics on a closed store: %d\n%s", code, body)
		}
	})
}

func TestCheckMetricsListen(t *testing.T) {
	tests := []struct {
		addr   string
		errHas string // "" = accepted
	}{
		{addr: ""},
		{addr: "127.0.0.1:9091"},
		{addr: "127.0.0.2:9091"},
		{addr: "[::1]:9091"},
		{addr: "localhost:9091"},
		{addr: "0.0.0.0:9091", errHas: "not a loopback address"},
		{addr: ":9091", errHas: "not a loopback address"},
		{addr: "[::]:9091", errHas: "not a loopback address"},
		{addr: "192.168.1.10:9091", errHas: "not a loopback address"},
		{addr: "example.com:9091", errHas: "not a loopback address"},
		{addr: "127.0.0.1", errHas: "not host:port"},
		{addr: "127.0.0.1:http", errHas: "invalid port"},
		{addr: "127.0.0.1:70000", errHas: "invalid port"},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			err := plugin.CheckMetricsListen(tc.addr)
			if tc.errHas == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("error %v, want it to contain %q", err, tc.errHas)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestServeMetrics(t *testing.T) {
	l, err := plugin.ListenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plugin.ListenMetrics("0.0.0.0:0"); err == nil {
		t.Fatal("ListenMetrics accepted a non-loopback address")
	}
	// The port is taken now: a second daemon fails at startup.
	if _, err := plugin.ListenMetrics(l.Addr().String()); err == nil || !strings.Contains(err.Error(), "listening for metrics") {
		t.Errorf("second listener on a taken port: %v", err)
	}
	health := plugin.NewHealth(func(context.Context) error { return nil })
	health.SetServing(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- plugin.ServeMetrics(ctx, l, plugin.MetricsHandler(plugin.NewMetrics(nil, quietLog()), health))
	}()
	if code, body := get(t, "http://"+l.Addr().String()+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, _ := get(t, "http://"+l.Addr().String()+"/other"); code != 404 {
		t.Errorf("/other: %d, want 404", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeMetrics after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeMetrics did not return")
	}
	if c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("metrics listener still open after shutdown")
	}
}
