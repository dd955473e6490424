package routing

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/anypb"
)

// Speaker is the narrow view of a BGP implementation that the agent needs.
// Everything the agent decides (which peers, which prefixes, what reaches
// the kernel) is computed outside it, so tests can drive the agent with a
// fake and the real speaker stays a thin adapter.
type Speaker interface {
	// Start begins listening and speaking as asn/routerID.
	Start(ctx context.Context, g GlobalSpec) error
	AddPeer(ctx context.Context, p PeerSpec) error
	DeletePeer(ctx context.Context, addr netip.Addr) error
	// Advertise originates prefix with nextHop; Withdraw stops it.
	Advertise(ctx context.Context, prefix netip.Prefix, nextHop netip.Addr) error
	Withdraw(ctx context.Context, prefix netip.Prefix) error
	// Paths lists every path learned from peers (all candidates, not just
	// the best one, so that ECMP and the import counters see them all).
	Paths(ctx context.Context) ([]LearnedPath, error)
	// Peers reports session state and counters.
	Peers(ctx context.Context) ([]PeerState, error)
	// Changes is signalled (coalesced) whenever paths or sessions change.
	Changes() <-chan struct{}
	// Stop ends the speaker. graceful: drop the sessions without a BGP
	// NOTIFICATION, as a crash would, so that peers keep our routes for the
	// graceful-restart time; otherwise tell peers to forget us.
	Stop(graceful bool)
}

// GlobalSpec is the speaker's own identity.
type GlobalSpec struct {
	ASN           uint32
	RouterID      netip.Addr
	ListenAddress string // "" = all
	Port          int    // also the port peers are dialled on
	RestartTime   time.Duration
}

// PeerState is one session as `node status` shows it.
type PeerState struct {
	Address     netip.Addr `json:"address"`
	State       string     `json:"state"` // Established, Active, Idle, ...
	Since       time.Time  `json:"since"` // when it entered the state (zero if unknown)
	Received    int        `json:"received"`
	Advertised  int        `json:"advertised"`
	EORReceived bool       `json:"endOfRibReceived"`
	// LocalRestarting: the speaker still announces a restart to this peer
	// (the Restart State bit of our OPEN).
	LocalRestarting bool `json:"localRestarting"`
}

// GoBGP is the Speaker backed by an in-process github.com/osrg/gobgp/v3.
type GoBGP struct {
	s       *server.BgpServer
	log     logrus.FieldLogger
	nextHop netip.Addr
	port    int
	restart time.Duration
	changes chan struct{}

	mu        sync.Mutex
	started   bool
	localOnly map[netip.Addr]bool // members of localOnlySet
	cancel    context.CancelFunc
	// advertised caches the per-peer advertised counts (see Peers).
	advertised   map[netip.Addr]int
	advertisedAt time.Time
	// peers caches Peers between session events (see Peers).
	peers      []PeerState
	peersAt    time.Time
	peersDirty atomic.Bool
	// rib mirrors the learned paths between lists (see ribMirror).
	rib *ribMirror
}

// ribMaxAge bounds how long Paths serves the mirror without listing the
// RIB: a safety net, the events keep it current.
const ribMaxAge = 30 * time.Second

// advertisedRefresh is how old the advertised counts of Peers may be.
// Counting them makes gobgp run the export policy over the whole RIB for
// every peer, on its server goroutine, which also handles the updates:
// done on every RIB change, that was O(peers x routes) work per received
// update, and it delayed the updates themselves at 32+ nodes.
const advertisedRefresh = 2 * time.Second

// NewGoBGP creates the speaker; nothing listens until Start.
func NewGoBGP(log logrus.FieldLogger) *GoBGP {
	g := &GoBGP{log: log, changes: make(chan struct{}, 1), localOnly: map[netip.Addr]bool{}, rib: newRIBMirror(ribMaxAge)}
	g.s = server.NewBgpServer(server.LoggerOption(&gobgpLogger{log: log.WithField("component", "gobgp")}))
	go g.s.Serve()
	return g
}

const localOnlySet = "calico-cnm-local-only"

var (
	ipv4Unicast = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	ipv6Unicast = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

// familyOf is the AFI/SAFI of a prefix.
func familyOf(p netip.Prefix) *api.Family {
	if p.Addr().Is4() {
		return ipv4Unicast
	}
	return ipv6Unicast
}

// Start implements Speaker.
func (g *GoBGP) Start(ctx context.Context, spec GlobalSpec) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return errors.New("BGP speaker already started")
	}
	port := int32(spec.Port)
	var listen []string
	if spec.ListenAddress != "" {
		listen = []string{spec.ListenAddress}
	}
	if err := g.s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:             spec.ASN,
		RouterId:        spec.RouterID.String(),
		ListenPort:      port,
		ListenAddresses: listen,
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: uint32(spec.RestartTime / time.Second)},
	}}); err != nil {
		return fmt.Errorf("starting the BGP speaker (AS %d, port %d): %w", spec.ASN, spec.Port, err)
	}
	// Routes learned over eBGP (from routers) are not passed on to anyone:
	// a node is not a transit router, every node peers with its routers
	// itself, and passing them into the mesh would only give peers paths
	// whose next hop is not the announcing node's (rejected anyway).
	// Peers in the localOnlySet (other route reflectors) get only what we
	// originate. The set needs an entry to exist: a never-used address.
	if err := g.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_NEIGHBOR, Name: localOnlySet, List: []string{"255.255.255.255/32"},
	}}); err != nil {
		return fmt.Errorf("defining the reflector neighbor set: %w", err)
	}
	if err := g.s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
		Name: "calico-cnm-no-transit",
		Statements: []*api.Statement{{
			Name:       "calico-cnm-reject-external",
			Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_EXTERNAL},
			Actions:    &api.Actions{RouteAction: api.RouteAction_REJECT},
		}, {
			Name: "calico-cnm-local-only",
			Conditions: &api.Conditions{
				NeighborSet: &api.MatchSet{Name: localOnlySet, Type: api.MatchSet_ANY},
				RouteType:   api.Conditions_ROUTE_TYPE_INTERNAL,
			},
			Actions: &api.Actions{RouteAction: api.RouteAction_REJECT},
		}},
	}}); err != nil {
		return fmt.Errorf("defining the export policy: %w", err)
	}
	if err := g.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_EXPORT,
		Policies:      []*api.Policy{{Name: "calico-cnm-no-transit"}},
		DefaultAction: api.RouteAction_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("assigning the export policy: %w", err)
	}
	g.nextHop, g.port, g.restart, g.started = spec.RouterID, spec.Port, spec.RestartTime, true
	wctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	if err := g.watch(wctx); err != nil {
		cancel()
		return err
	}
	return nil
}

// watch follows gobgp's events: adj-in updates keep the path mirror
// current. What sessions do to paths (dropped when one ends, marked stale
// by a graceful restart and removed at its End-of-RIB or when the restart
// timer expires, dropped with a deleted peer) comes without adj-in events
// but always with a session event or an End-of-RIB: those make the next
// Paths list the RIB. One watch for all three, so they arrive in gobgp's
// order: with two, a session's end could be handled before an update it
// had sent, and the late update would put the dead session's path back.
// Best-path events are not watched: every change they report follows one
// of those, and converting each was a tenth of the CPU of a 64-node burst.
// Every event pokes the agent.
func (g *GoBGP) watch(ctx context.Context) error {
	err := g.s.WatchEvent(ctx, &api.WatchEventRequest{
		Peer: &api.WatchEventRequest_Peer{},
		Table: &api.WatchEventRequest_Table{Filters: []*api.WatchEventRequest_Table_Filter{
			{Type: api.WatchEventRequest_Table_Filter_ADJIN},
			{Type: api.WatchEventRequest_Table_Filter_EOR},
		}},
	}, func(ev *api.WatchEventResponse) {
		if ev.GetPeer() != nil {
			g.sessionsChanged()
		} else if evs, ok := g.ribEvents(ev.GetTable().GetPaths()); ok {
			g.rib.apply(evs)
		} else {
			g.sessionsChanged()
		}
		g.poke()
	})
	if err != nil {
		return fmt.Errorf("watching the BGP RIB and sessions: %w", err)
	}
	return nil
}

// sessionsChanged: the next Peers and Paths list gobgp's state again.
func (g *GoBGP) sessionsChanged() {
	g.peersDirty.Store(true)
	g.rib.invalidate()
}

// ribEvents converts adj-in paths; ok is false for an End-of-RIB (a path
// without NLRI) and for a path that cannot be decoded or has no next hop
// (gobgp drops attributes it cannot marshal for the API): the RIB is
// listed again rather than the mirror left behind.
func (g *GoBGP) ribEvents(paths []*api.Path) ([]ribEvent, bool) {
	out := make([]ribEvent, 0, len(paths))
	for _, p := range paths {
		if p.GetNlri() == nil && len(p.GetNlriBinary()) == 0 {
			return nil, false // End-of-RIB
		}
		lp, ok, err := learnedFromAPI(p)
		if err == nil && ok && !p.IsWithdraw && !lp.NextHop.IsValid() {
			err = fmt.Errorf("path for %s from %s has no next hop", lp.Prefix, lp.Peer)
		}
		if err != nil {
			g.log.WithError(err).Debug("undecodable adj-in path: listing the RIB again")
			return nil, false
		}
		if ok {
			out = append(out, ribEvent{path: lp, withdraw: p.IsWithdraw})
		}
	}
	return out, true
}

func (g *GoBGP) poke() {
	select {
	case g.changes <- struct{}{}:
	default:
	}
}

// Changes implements Speaker.
func (g *GoBGP) Changes() <-chan struct{} { return g.changes }

// AddPeer implements Speaker. Graceful restart is on for every session (we
// are both a restarting speaker and a helper); timers are short so that a
// restarted neighbour is re-established within seconds.
func (g *GoBGP) AddPeer(ctx context.Context, p PeerSpec) error {
	peer := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.ASN,
			AuthPassword:    p.Password,
			Description:     string(p.Type) + ":" + p.Name,
		},
		Transport: &api.Transport{RemotePort: uint32(g.port), PassiveMode: p.Passive},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           3,
			HoldTime:               90,
			KeepaliveInterval:      30,
			IdleHoldTimeAfterReset: 1,
		}},
		GracefulRestart: &api.GracefulRestart{
			Enabled:         true,
			RestartTime:     uint32(g.restart / time.Second),
			DeferralTime:    5,
			LocalRestarting: p.Restarting,
		},
		// IPv6 prefixes ride the same (IPv4) session with IPv6 next hops;
		// a peer that does not offer IPv6 unicast just never gets them.
		AfiSafis: []*api.AfiSafi{{
			Config:            &api.AfiSafiConfig{Family: ipv4Unicast, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		}, {
			Config:            &api.AfiSafiConfig{Family: ipv6Unicast, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		}},
	}
	if p.RRClient {
		peer.RouteReflector = &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: p.ClusterID}
	}
	if p.LocalOnly {
		if err := g.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_NEIGHBOR, Name: localOnlySet, List: []string{p.Address.String() + "/32"},
		}}); err != nil {
			return fmt.Errorf("adding BGP peer %s to the reflector set: %w", p, err)
		}
		g.mu.Lock()
		g.localOnly[p.Address] = true
		g.mu.Unlock()
	} else if err := g.removeLocalOnly(ctx, p.Address); err != nil {
		return err
	}
	if err := g.s.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
		return fmt.Errorf("adding BGP peer %s: %w", p, err)
	}
	g.peersDirty.Store(true)
	return nil
}

func (g *GoBGP) removeLocalOnly(ctx context.Context, addr netip.Addr) error {
	g.mu.Lock()
	member := g.localOnly[addr]
	delete(g.localOnly, addr)
	g.mu.Unlock()
	if !member {
		return nil
	}
	err := g.s.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_NEIGHBOR, Name: localOnlySet, List: []string{addr.String() + "/32"},
	}})
	if err != nil {
		return fmt.Errorf("removing %s from the reflector set: %w", addr, err)
	}
	return nil
}

// DeletePeer implements Speaker.
func (g *GoBGP) DeletePeer(ctx context.Context, addr netip.Addr) error {
	if err := g.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
		return fmt.Errorf("deleting BGP peer %s: %w", addr, err)
	}
	g.peersDirty.Store(true)
	g.rib.invalidate() // its paths went without adj-in events
	return g.removeLocalOnly(ctx, addr)
}

func originPath(prefix netip.Prefix, nextHop netip.Addr) (*api.Path, error) {
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: prefix.Addr().String(), PrefixLen: uint32(prefix.Bits())})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0}) // IGP
	if err != nil {
		return nil, err
	}
	nh, err := anypb.New(&api.NextHopAttribute{NextHop: nextHop.String()})
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: familyOf(prefix), Nlri: nlri, Pattrs: []*anypb.Any{origin, nh}}, nil
}

// Advertise implements Speaker.
func (g *GoBGP) Advertise(ctx context.Context, prefix netip.Prefix, nextHop netip.Addr) error {
	if prefix.Addr().Is4() != nextHop.Is4() {
		return fmt.Errorf("advertising %s: next hop %s is of the other address family", prefix, nextHop)
	}
	p, err := originPath(prefix.Masked(), nextHop)
	if err != nil {
		return err
	}
	if _, err := g.s.AddPath(ctx, &api.AddPathRequest{Path: p}); err != nil {
		return fmt.Errorf("advertising %s: %w", prefix, err)
	}
	return nil
}

// Withdraw implements Speaker.
func (g *GoBGP) Withdraw(ctx context.Context, prefix netip.Prefix) error {
	// The next hop does not identify the path; only its family must match.
	nh := g.nextHop
	if prefix.Addr().Is6() {
		nh = netip.IPv6Unspecified()
	}
	p, err := originPath(prefix.Masked(), nh)
	if err != nil {
		return err
	}
	if err := g.s.DeletePath(ctx, &api.DeletePathRequest{Family: familyOf(prefix), Path: p}); err != nil {
		return fmt.Errorf("withdrawing %s: %w", prefix, err)
	}
	return nil
}

// Paths implements Speaker: the mirror, listed again when events could
// not keep it current.
func (g *GoBGP) Paths(ctx context.Context) ([]LearnedPath, error) {
	return g.rib.read(func() ([]LearnedPath, error) { return g.listPaths(ctx) })
}

// listPaths lists every learned path of the RIB.
func (g *GoBGP) listPaths(ctx context.Context) ([]LearnedPath, error) {
	var out []LearnedPath
	var convErr error
	for _, fam := range []*api.Family{ipv4Unicast, ipv6Unicast} {
		// Binary only: the default converts every path's NLRI and
		// attributes into protobuf Any messages for us to convert back,
		// which was most of a pass's CPU at 64 nodes.
		req := &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: fam, EnableOnlyBinary: true}
		err := g.s.ListPath(ctx, req, func(d *api.Destination) {
			for _, p := range d.Paths {
				if p.IsWithdraw {
					continue
				}
				lp, ok, err := learnedFromAPI(p)
				if err != nil {
					convErr = err
					continue
				}
				if ok {
					out = append(out, lp)
				}
			}
		})
		if err != nil {
			return nil, fmt.Errorf("listing the BGP RIB: %w", err)
		}
	}
	if convErr != nil {
		g.log.WithError(convErr).Debug("skipped an undecodable path")
	}
	return out, nil
}

// learnedFromAPI converts a gobgp path; ok is false for our own paths.
func learnedFromAPI(p *api.Path) (LearnedPath, bool, error) {
	peer, err := netip.ParseAddr(p.NeighborIp)
	if err != nil || !peer.IsValid() || peer.IsUnspecified() {
		return LearnedPath{}, false, nil // locally originated
	}
	if p.Family == nil {
		p.Family = ipv4Unicast
	}
	nlri, err := apiutil.GetNativeNlri(p)
	if err != nil {
		return LearnedPath{}, false, fmt.Errorf("path from %s: %w", peer, err)
	}
	pfx, err := netip.ParsePrefix(nlri.String())
	if err != nil {
		return LearnedPath{}, false, fmt.Errorf("path from %s: prefix %q: %w", peer, nlri.String(), err)
	}
	lp := LearnedPath{Prefix: pfx, Peer: peer, Stale: p.Stale}
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return LearnedPath{}, false, fmt.Errorf("path from %s: attributes: %w", peer, err)
	}
	for _, attr := range attrs {
		switch v := attr.(type) {
		case *bgp.PathAttributeNextHop:
			lp.NextHop, _ = netip.AddrFromSlice(v.Value.To4())
		case *bgp.PathAttributeMpReachNLRI:
			if v.Nexthop != nil {
				if a, ok := netip.AddrFromSlice(v.Nexthop); ok {
					lp.NextHop = a.Unmap()
				}
			}
		case *bgp.PathAttributeAsPath:
			for _, seg := range v.Value {
				lp.ASPath = append(lp.ASPath, seg.GetAS()...)
			}
		case *bgp.PathAttributeLocalPref:
			lp.LocalPref = v.Value
		}
	}
	return lp, true, nil
}

// Peers implements Speaker.
func (g *GoBGP) Peers(ctx context.Context) ([]PeerState, error) {
	// Listing the sessions runs on gobgp's server goroutine and takes every
	// session's lock for writing: on a reflector with 63 clients, doing it
	// for every route update held up the reflection itself. Between session
	// events (state changes, End-of-RIB) the last list is reused, for at
	// most peersMaxAge (the counters in it are for `node status` only).
	g.mu.Lock()
	cached, at := g.peers, g.peersAt
	g.mu.Unlock()
	if cached != nil && !g.peersDirty.Load() && time.Since(at) < peersMaxAge {
		return slices.Clone(cached), nil
	}
	g.peersDirty.Store(false) // an event from here on lists again
	out, err := g.listPeersCounted(ctx)
	if err != nil {
		g.peersDirty.Store(true)
		return nil, err
	}
	if !sameSessions(cached, out) {
		// This list may be ahead of the events (it ran on gobgp's server
		// goroutine; the adj-in events it already counted may still be
		// queued to us): a session seen synced here must not be paired with
		// a mirror that lacks its routes, so the next Paths lists the RIB.
		g.rib.invalidate()
	}
	g.mu.Lock()
	g.peers, g.peersAt = slices.Clone(out), time.Now()
	g.mu.Unlock()
	return out, nil
}

// sameSessions: the same sessions in the same state, End-of-RIB included.
func sameSessions(a, b []PeerState) bool {
	if len(a) != len(b) {
		return false
	}
	type key struct {
		state string
		eor   bool
	}
	byAddr := make(map[netip.Addr]key, len(a))
	for _, s := range a {
		byAddr[s.Address] = key{s.State, s.EORReceived}
	}
	for _, s := range b {
		if k, ok := byAddr[s.Address]; !ok || k != (key{s.State, s.EORReceived}) {
			return false
		}
	}
	return true
}

// peersMaxAge bounds how long Peers reuses a list without session events.
const peersMaxAge = time.Second

// listPeersCounted lists the sessions, with advertised counts refreshed
// when the established sessions changed, else at most every
// advertisedRefresh.
func (g *GoBGP) listPeersCounted(ctx context.Context) ([]PeerState, error) {
	g.mu.Lock()
	refresh := time.Since(g.advertisedAt) >= advertisedRefresh
	cached := g.advertised
	g.mu.Unlock()
	out, err := g.listPeers(ctx, refresh)
	if err == nil && !refresh && !sameEstablished(out, cached) {
		refresh = true
		out, err = g.listPeers(ctx, true)
	}
	if err != nil {
		return nil, err
	}
	if !refresh {
		for i := range out {
			out[i].Advertised = cached[out[i].Address]
		}
		return out, nil
	}
	fresh := make(map[netip.Addr]int, len(out))
	for _, ps := range out {
		if ps.State == "Established" {
			fresh[ps.Address] = ps.Advertised
		}
	}
	g.mu.Lock()
	g.advertised, g.advertisedAt = fresh, time.Now()
	g.mu.Unlock()
	return out, nil
}

// sameEstablished: the established sessions are exactly those cached.
func sameEstablished(states []PeerState, cached map[netip.Addr]int) bool {
	n := 0
	for _, s := range states {
		if s.State != "Established" {
			continue
		}
		n++
		if _, ok := cached[s.Address]; !ok {
			return false
		}
	}
	return n == len(cached)
}

func (g *GoBGP) listPeers(ctx context.Context, withAdvertised bool) ([]PeerState, error) {
	var out []PeerState
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: withAdvertised}, func(p *api.Peer) {
		var ps PeerState
		if p.Conf != nil {
			ps.Address, _ = netip.ParseAddr(p.Conf.NeighborAddress)
		}
		if p.State != nil {
			ps.State = sessionStateName(p.State.SessionState)
		}
		if p.Timers != nil && p.Timers.State != nil {
			if ps.State == "Established" && p.Timers.State.Uptime != nil {
				ps.Since = p.Timers.State.Uptime.AsTime()
			} else if p.Timers.State.Downtime != nil {
				ps.Since = p.Timers.State.Downtime.AsTime()
			}
		}
		ps.LocalRestarting = p.GracefulRestart != nil && p.GracefulRestart.LocalRestarting
		eor := len(p.AfiSafis) > 0
		for _, af := range p.AfiSafis {
			if af.State != nil {
				ps.Received += int(af.State.Received)
				ps.Advertised += int(af.State.Advertised)
			}
			// IPv4 always counts (as before IPv6 existed); IPv6 only when
			// the peer does graceful restart for it, else a peer without
			// IPv6 would hold up our sync until the timeout.
			gr := af.MpGracefulRestart
			isV4 := af.Config != nil && af.Config.Family != nil && af.Config.Family.Afi == api.Family_AFI_IP
			if !isV4 && (gr == nil || gr.State == nil || !gr.State.Received) {
				continue
			}
			if gr == nil || gr.State == nil || !gr.State.EndOfRibReceived {
				eor = false
			}
		}
		ps.EORReceived = eor
		out = append(out, ps)
	})
	if err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	return out, nil
}

func sessionStateName(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_IDLE:
		return "Idle"
	case api.PeerState_CONNECT:
		return "Connect"
	case api.PeerState_ACTIVE:
		return "Active"
	case api.PeerState_OPENSENT:
		return "OpenSent"
	case api.PeerState_OPENCONFIRM:
		return "OpenConfirm"
	case api.PeerState_ESTABLISHED:
		return "Established"
	}
	return "Unknown"
}

// Stop implements Speaker. gobgp has no way to close its sessions without
// sending a NOTIFICATION, and a NOTIFICATION makes peers drop our routes at
// once; so the graceful stop only stops our watchers and leaves the sessions
// to the process exit, where the kernel closes the sockets and peers keep our
// routes as stale for the restart time (RFC 4724) - exactly what kill -9 does.
func (g *GoBGP) Stop(graceful bool) {
	g.mu.Lock()
	cancel := g.cancel
	started := g.started
	g.cancel = nil
	g.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if !graceful && started {
		g.s.Stop()
	}
}

// A note on withdrawals a peer never got an advertisement for (seen on the
// wire, e.g. a client withdrawing a block towards reflector r2 after r1's
// copy went away): gobgp sends them on purpose. When the best path for a
// prefix moves to a path learned from peer X, it withdraws the old best
// towards X in case X had it from us (server.go filterPathFromSourcePeer,
// and prePolicyFilterpath for an old eBGP or local best replaced over
// iBGP), without tracking what X was sent. The receiver holds no path from
// us for the prefix and drops the withdrawal; nothing is lost, nothing is
// logged. Not preventable without patching gobgp, so left alone.

// gobgpLogger adapts logrus to gobgp's logger. gobgp's Fatal/Panic are for
// its own internal bugs; they are logged as errors rather than killing the
// daemon that hosts the plugin sockets.
type gobgpLogger struct{ log logrus.FieldLogger }

func (l *gobgpLogger) Panic(msg string, f gobgplog.Fields) {
	l.log.WithFields(logrus.Fields(f)).Error("gobgp panic: " + msg)
}
func (l *gobgpLogger) Fatal(msg string, f gobgplog.Fields) {
	l.log.WithFields(logrus.Fields(f)).Error("gobgp fatal: " + msg)
}
func (l *gobgpLogger) Error(msg string, f gobgplog.Fields) {
	l.log.WithFields(logrus.Fields(f)).Error(msg)
}
func (l *gobgpLogger) Warn(msg string, f gobgplog.Fields) {
	if harmlessGobgpWarning(msg) {
		l.log.WithFields(logrus.Fields(f)).Debug(msg)
		return
	}
	l.log.WithFields(logrus.Fields(f)).Warn(msg)
}

// harmlessGobgpWarning: logged at debug only.
//
// "restart flag is not set": a restarting peer's OPEN lacks the Restart
// State bit, typically on a session that connected after the peer's gobgp
// had ended its restart (the agent re-creates such sessions with the bit,
// see restoreRestartFlag, but a peer that dials in between still gets an
// OPEN without it). gobgp, as the helper, ignores the missing bit ("just
// ignore" in fsm.go): it keeps the stale routes until the End-of-RIB as
// usual, so nothing is lost.
func harmlessGobgpWarning(msg string) bool {
	return msg == "restart flag is not set"
}

// Info is logged at debug: gobgp is chatty about every session transition,
// which the agent already logs in its own words.
func (l *gobgpLogger) Info(msg string, f gobgplog.Fields) {
	l.log.WithFields(logrus.Fields(f)).Debug(msg)
}
func (l *gobgpLogger) Debug(msg string, f gobgplog.Fields) {}
func (l *gobgpLogger) SetLevel(gobgplog.LogLevel)          {}
func (l *gobgpLogger) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
