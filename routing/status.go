package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/sirupsen/logrus"
)

// Status is what `calico-cnm node status` shows, served by the daemon on
// its status socket.
type Status struct {
	Node           string         `json:"node"`
	Address        string         `json:"address"`
	IPv6NextHop    string         `json:"ipv6NextHop,omitempty"` // "" = no IPv6 routing
	ASN            uint32         `json:"asn"`
	RouteReflector bool           `json:"routeReflector"`
	ClusterID      string         `json:"clusterID,omitempty"`
	Mesh           bool           `json:"nodeToNodeMesh"`
	Synced         bool           `json:"synced"` // stale learned routes may be deleted
	Peers          []PeerStatus   `json:"peers"`
	Advertised     []string       `json:"advertised"`
	Routes         []RouteStatus  `json:"routes"`
	Rejected       map[string]int `json:"rejected"`
	// RouteError says why the last pass could not program the learned
	// routes into the kernel ("" when it could); /healthz reports it.
	RouteError string       `json:"routeError,omitempty"`
	VXLAN      *VXLANStatus `json:"vxlan,omitempty"`
	// BGPOff: the daemon runs without a speaker (the status is VXLAN's).
	BGPOff bool `json:"bgpOff,omitempty"`
}

// PeerStatus is one session.
type PeerStatus struct {
	Address    string    `json:"address"`
	Name       string    `json:"name"`
	ASN        uint32    `json:"asn"`
	Type       PeerType  `json:"type"`
	State      string    `json:"state"`
	Since      time.Time `json:"since,omitzero"`
	Uptime     string    `json:"uptime,omitempty"` // for humans; Since is exact
	Received   int       `json:"received"`
	Accepted   int       `json:"accepted"`
	Advertised int       `json:"advertised"`
}

// PeerEstablished is the State of a session that is up.
const PeerEstablished = "Established"

// RouteStatus is one learned route in the kernel.
type RouteStatus struct {
	Dst string   `json:"dst"`
	Via []string `json:"via"`
}

// serveStatus answers GET /status on a unix socket until ctx ends.
func serveStatus(ctx context.Context, path string, get func(context.Context) Status, log logrus.FieldLogger) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale status socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	_ = os.Chmod(path, 0o600)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(get(r.Context()))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.WithField("socket", path).Debug("serving BGP status")
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// FetchStatus asks the daemon listening on socket for its BGP status.
func FetchStatus(ctx context.Context, socket string) (Status, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://calico-cnm/status", nil)
	if err != nil {
		return Status{}, err
	}
	res, err := client.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("no status from the daemon at %s (is `calico-cnm serve` running on this host, with --bgp or a VXLAN pool?): %w", socket, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return Status{}, fmt.Errorf("BGP status from %s: HTTP %d", socket, res.StatusCode)
	}
	var s Status
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		return Status{}, fmt.Errorf("decoding BGP status: %w", err)
	}
	return s, nil
}

// FormatUptime renders a duration like calicoctl does ("3m12s", "2h05m").
func FormatUptime(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// VXLANStatus is the VXLAN part of `node status`.
type VXLANStatus struct {
	Device string `json:"device,omitempty"` // "" while no pool uses VXLAN
	VTEP   string `json:"vtep,omitempty"`
	MAC    string `json:"mac,omitempty"`
	MTU    int    `json:"mtu,omitempty"`
	// Passes counts completed syncs (tests wait for one instead of
	// sleeping).
	Passes uint64            `json:"passes"`
	Nodes  []VXLANNodeStatus `json:"nodes"`
}

// VXLANNodeStatus is one remote node as this node reaches it.
type VXLANNodeStatus struct {
	Name   string    `json:"name"`
	NodeIP string    `json:"nodeIP,omitempty"`
	VTEP   string    `json:"vtep,omitempty"`
	MAC    string    `json:"mac,omitempty"`
	Routes RouteKind `json:"routes"`
	Blocks []string  `json:"blocks,omitempty"` // routed by VXLAN (via VTEP or directly)
}

// RouteKind says how this node reaches another node's workloads.
type RouteKind string

// Route kinds shown by `node status` and `node list`.
const (
	RouteVXLAN  RouteKind = "vxlan"  // encapsulated: <block> via <VTEP> dev vxlan.calico onlink
	RouteDirect RouteKind = "direct" // same subnet, computed from the datastore: <block> via <node>
	RouteBGP    RouteKind = "bgp"    // same subnet, left to the routes BGP learns
	RouteNone   RouteKind = "-"      // no VXLAN pool, or the node has no VTEP yet
)

// VXLANRouter is what the BGP agent asks the VXLAN manager.
type VXLANRouter interface {
	Owns(dst netip.Prefix) bool
	Status() VXLANStatus
}

// leaveToVXLAN drops the learned routes whose destinations VXLAN routes:
// for an Always pool (and a CrossSubnet pool's remote-subnet nodes) the
// encapsulated route must win over the path BGP learned.
func leaveToVXLAN(routes map[netip.Prefix][]netip.Addr, v VXLANRouter) {
	if v == nil {
		return
	}
	for dst := range routes {
		if v.Owns(dst) {
			delete(routes, dst)
		}
	}
}

func vxlanStatus(v VXLANRouter) *VXLANStatus {
	if v == nil {
		return nil
	}
	st := v.Status()
	return &st
}

// ServeVXLANStatus serves `node status` on the status socket when BGP is
// off (with BGP on the agent serves it, VXLAN included).
func ServeVXLANStatus(ctx context.Context, path, node string, v VXLANRouter, log logrus.FieldLogger) error {
	return serveStatus(ctx, path, func(context.Context) Status {
		st := v.Status()
		return Status{Node: node, BGPOff: true, Peers: []PeerStatus{}, Advertised: []string{}, Routes: []RouteStatus{}, VXLAN: &st}
	}, log)
}
