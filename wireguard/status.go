package wireguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/vxlan"
)

// What happens to the traffic to a node without a peer.
const (
	TrafficDropped = "dropped"
	TrafficClear   = "clear"
)

// Status is the WireGuard part of `node status`.
type Status struct {
	Enabled        bool   `json:"enabled"`
	Mode           string `json:"mode,omitempty"`
	Device         string `json:"device,omitempty"`
	Implementation string `json:"implementation,omitempty"`
	PublicKey      string `json:"publicKey,omitempty"`
	Address        string `json:"address,omitempty"` // where peers send: address:port
	MTU            int    `json:"mtu,omitempty"`
	// Passes counts completed syncs (tests wait for one instead of
	// sleeping).
	Passes      uint64            `json:"passes"`
	Peers       []PeerStatus      `json:"peers"`
	Unencrypted []UnencryptedNode `json:"unencrypted,omitempty"`
}

// PeerStatus is one peer as the device reports it.
type PeerStatus struct {
	Node          string    `json:"node"`
	PublicKey     string    `json:"publicKey"`
	Endpoint      string    `json:"endpoint"`
	AllowedIPs    []string  `json:"allowedIPs"`
	LastHandshake time.Time `json:"lastHandshake,omitzero"`
	Handshakes    uint64    `json:"handshakes"` // seen by this daemon
	RxBytes       int64     `json:"rxBytes"`
	TxBytes       int64     `json:"txBytes"`
}

// UnencryptedNode is a remote node without a peer.
type UnencryptedNode struct {
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	Traffic string `json:"traffic"` // TrafficDropped or TrafficClear
}

// publish records the pass's result; the peers' counters are read live
// by Status.
func (m *Manager) publish(cfg datastore.ClusterConfig, mode string, port int) {
	st := Status{Enabled: cfg.WireGuard, Mode: mode, Peers: []PeerStatus{}}
	for _, u := range m.unenc {
		st.Unencrypted = append(st.Unencrypted, u)
	}
	slices.SortFunc(st.Unencrypted, func(a, b UnencryptedNode) int { return strings.Compare(a.Node, b.Node) })
	m.mu.Lock()
	defer m.mu.Unlock()
	if cfg.WireGuard && m.link != nil {
		st.Device, st.Implementation, st.MTU = Device, m.link.Implementation(), m.uplinkMTU-Overhead
		st.PublicKey = m.key.PublicKey().String()
		st.Address = fmt.Sprintf("%s:%d", m.addr, port)
	}
	st.Passes = m.status.Passes + 1
	m.status = st
}

// Status is the last pass's result with the device's peers as they are
// now.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Peers = []PeerStatus{}
	st.Unencrypted = slices.Clone(st.Unencrypted)
	for _, p := range m.peerStatesLocked() {
		st.Peers = append(st.Peers, p)
	}
	return st
}

// peerStatesLocked reads the device's peers, counting handshakes seen
// since the last look (a handshake changes the peer's last handshake
// time).
func (m *Manager) peerStatesLocked() []PeerStatus {
	if m.link == nil || !m.status.Enabled {
		return nil
	}
	ds, err := m.link.State()
	if err != nil {
		m.log.WithError(err).Debug("reading the WireGuard peers")
		return nil
	}
	var out []PeerStatus
	for _, p := range ds.Peers {
		if !p.LastHandshake.IsZero() && !p.LastHandshake.Equal(m.prevHS[p.PublicKey]) {
			m.prevHS[p.PublicKey] = p.LastHandshake
			m.hsCount[p.PublicKey]++
		}
		ps := PeerStatus{Node: m.peerNode[p.PublicKey], PublicKey: p.PublicKey.String(), Endpoint: p.Endpoint.String(),
			AllowedIPs: []string{}, LastHandshake: p.LastHandshake, Handshakes: m.hsCount[p.PublicKey], RxBytes: p.RxBytes, TxBytes: p.TxBytes}
		for _, a := range sortedPrefixes(p.AllowedIPs) {
			ps.AllowedIPs = append(ps.AllowedIPs, a.String())
		}
		out = append(out, ps)
		m.noteSilenceLocked(p)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// noteSilenceLocked logs a peer this node sends to without ever
// completing a handshake: most likely its record carries a key it does
// not hold, or its port is blocked.
func (m *Manager) noteSilenceLocked(p PeerState) {
	fresh := !p.LastHandshake.IsZero() && time.Since(p.LastHandshake) < 3*time.Minute
	if fresh || p.TxBytes == 0 {
		delete(m.silent, p.PublicKey)
		delete(m.warned, p.PublicKey)
		return
	}
	since, ok := m.silent[p.PublicKey]
	if !ok {
		m.silent[p.PublicKey] = time.Now()
		return
	}
	if time.Since(since) < silentAfter || m.warned[p.PublicKey] {
		return
	}
	m.warned[p.PublicKey] = true
	node := m.peerNode[p.PublicKey]
	m.log.WithFields(logrus.Fields{"peer": node, "publicKey": p.PublicKey.String(), "endpoint": p.Endpoint.String(), "txBytes": p.TxBytes}).
		Warn("no WireGuard handshake with " + node + " although this node keeps sending to it: the public key in its record is not the key it holds, or it does not know this node's key, or UDP to its port is blocked; its workloads' traffic is dropped, not sent in clear")
}

// WorkloadMTU wraps the MTU choice of the other encapsulations (next,
// VXLAN's): while WireGuard is on, a container gets the uplink MTU minus
// Overhead, minus vxlan.Overhead more in a pool that may encapsulate (next
// answers non-zero).
func (m *Manager) WorkloadMTU(next func(ctx context.Context, ip net.IP) (int, error)) func(ctx context.Context, ip net.IP) (int, error) {
	return func(ctx context.Context, ip net.IP) (int, error) {
		base := 0
		if next != nil {
			var err error
			if base, err = next(ctx, ip); err != nil {
				return 0, err
			}
		}
		cfg, err := m.readConfig(ctx)
		if err != nil || !cfg.WireGuard {
			return base, err
		}
		m.mu.Lock()
		uplink := m.uplinkMTU
		m.mu.Unlock()
		if uplink == 0 {
			addr, err := m.nodeAddress()
			if err != nil {
				return 0, err
			}
			if uplink, err = m.d.Kernel.UplinkMTU(addr); err != nil {
				return 0, err
			}
		}
		if base > 0 {
			return uplink - Overhead - vxlan.Overhead, nil
		}
		return uplink - Overhead, nil
	}
}

// Metric names on /metrics.
const (
	MetricEnabled       = "calico_cnm_wireguard_enabled"
	MetricHandshakes    = "calico_cnm_wireguard_peer_handshakes_total"
	MetricLastHandshake = "calico_cnm_wireguard_peer_last_handshake_seconds"
	MetricRxBytes       = "calico_cnm_wireguard_peer_received_bytes_total"
	MetricTxBytes       = "calico_cnm_wireguard_peer_sent_bytes_total"
)

var (
	descEnabled    = prometheus.NewDesc(MetricEnabled, "1 while this node's WireGuard device runs.", []string{"implementation"}, nil)
	descHandshakes = prometheus.NewDesc(MetricHandshakes, "WireGuard handshakes completed with a peer, as seen by this daemon.", []string{"peer", "public_key"}, nil)
	descLastHS     = prometheus.NewDesc(MetricLastHandshake, "Unix time of the last WireGuard handshake with a peer.", []string{"peer", "public_key"}, nil)
	descRx         = prometheus.NewDesc(MetricRxBytes, "Bytes received from a WireGuard peer.", []string{"peer", "public_key"}, nil)
	descTx         = prometheus.NewDesc(MetricTxBytes, "Bytes sent to a WireGuard peer.", []string{"peer", "public_key"}, nil)
)

// Collector is the manager's /metrics, read from the device at scrape.
func (m *Manager) Collector() prometheus.Collector { return collector{m} }

type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEnabled, descHandshakes, descLastHS, descRx, descTx} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.m.Status()
	if !st.Enabled || st.Device == "" {
		return
	}
	ch <- prometheus.MustNewConstMetric(descEnabled, prometheus.GaugeValue, 1, st.Implementation)
	for _, p := range st.Peers {
		ch <- prometheus.MustNewConstMetric(descHandshakes, prometheus.CounterValue, float64(p.Handshakes), p.Node, p.PublicKey)
		if !p.LastHandshake.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLastHS, prometheus.GaugeValue, float64(p.LastHandshake.UnixNano())/1e9, p.Node, p.PublicKey)
		}
		ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(p.RxBytes), p.Node, p.PublicKey)
		ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(p.TxBytes), p.Node, p.PublicKey)
	}
}

// SocketName is the daemon's WireGuard socket in its state directory:
// GET /status, POST /rotate-key.
const SocketName = "wireguard.sock"

// Serve answers on the socket at path until ctx ends.
func (m *Manager) Serve(ctx context.Context, path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	// It rotates the node's key: only root may reach it.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return fmt.Errorf("restricting %s to root: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(m.Status())
	})
	mux.HandleFunc("POST /rotate-key", func(w http.ResponseWriter, r *http.Request) {
		key, err := m.RotateKey(r.Context())
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(map[string]string{"Err": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"publicKey": key})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// FetchStatus asks the daemon at socket for its WireGuard status.
func FetchStatus(ctx context.Context, socket string) (Status, error) {
	var st Status
	err := call(ctx, socket, http.MethodGet, "/status", &st)
	return st, err
}

// RotateKey asks the daemon at socket to replace its key; it returns the
// new public key.
func RotateKey(ctx context.Context, socket string) (string, error) {
	var out struct {
		PublicKey string `json:"publicKey"`
	}
	err := call(ctx, socket, http.MethodPost, "/rotate-key", &out)
	return out.PublicKey, err
}

func call(ctx context.Context, socket, method, path string, out any) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, method, "http://calico-cnm"+path, nil)
	if err != nil {
		return err
	}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("no answer from the daemon at %s (is `calico-cnm serve` running on this host?): %w", socket, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		var e struct{ Err string }
		if json.Unmarshal(body, &e) == nil && e.Err != "" {
			return errors.New(e.Err)
		}
		return fmt.Errorf("%s %s: HTTP %d", method, path, res.StatusCode)
	}
	return json.Unmarshal(body, out)
}
