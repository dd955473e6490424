package routing

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow"
	"github.com/calico-cnm/calico-cnm/internal/nlconv"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// BlockSource is the part of IPAM routing follows (ipam.Engine has it).
type BlockSource interface {
	WatchHostBlocks(ctx context.Context, host string) <-chan ipam.BlockEvent
}

// Store is the part of the datastore routing uses (*datastore.Store has it).
type Store = follow.Store

// Deps are what the agent works with; tests pass fakes for Speaker and
// Routes.
type Deps struct {
	// Store is where the agent writes its node record; Records is the
	// datastore syncer it reads everything from.
	Store    Store
	Records  datastore.Records
	Blocks   BlockSource
	Speaker  Speaker
	Routes   RouteTable
	NodeName string
	Config   Config
	Log      logrus.FieldLogger
	// DetectAddress finds the node address when Config.NodeIP is empty
	// (default: DetectAddress in the current network namespace).
	DetectAddress func(method string) (netip.Addr, error)
	// DetectIPv6 finds the IPv6 next hop when Config.NodeIPv6 is empty
	// (default: DetectIPv6 in the current network namespace).
	DetectIPv6 func(v4 netip.Addr) (netip.Addr, bool, error)
	// ResyncInterval re-checks everything even without events (default 10s).
	ResyncInterval time.Duration
	// VXLAN, when set, routes some pools' blocks itself: learned routes to
	// destinations it owns are not installed (VXLAN takes precedence), and
	// its status is part of the agent's.
	VXLAN VXLANRouter
}

// Agent registers the node, runs the speaker's sessions and exports, and
// keeps the kernel's learned routes in step with the RIB.
type Agent struct {
	d   Deps
	log logrus.FieldLogger
	// routes is d.Routes behind what routing last listed and changed.
	routes *knownRoutes

	start time.Time
	self  Self

	// secretProblems: the peers left out for an unreadable secret, with
	// the reason (logged when it changes).
	secretProblems map[string]string

	// Inputs, refreshed on datastore events.
	nodes   []datastore.Node
	peers   []datastore.BGPPeer
	cfg     datastore.BGPConfig
	pools   []netip.Prefix
	blocks  map[netip.Prefix]bool
	workIPs []netip.Addr

	// What the speaker has been told (sessions includes retiring ones).
	sessions   map[netip.Addr]PeerSpec
	advertised map[netip.Prefix]bool
	// blockEvents are this node's block changes (set by
	// reconcileOnChanges; nil before and once closed). exportsDirty: block
	// events were applied outside a pass (see readSpeaker), the next pass
	// syncs the exports again. blocksEnded: blockEvents closed, which
	// ends Run (the agent would follow the node's blocks no more).
	blockEvents  <-chan ipam.BlockEvent
	blocksEnded  bool
	exportsDirty bool
	// handover: topology changes in flight (see handover.go).
	handover handover
	// grReadded: sessions re-created once to restore the restart flag.
	grReadded map[netip.Addr]bool

	synced bool
	// restarted: this node ran before (its record had an address, or the
	// kernel has routes it learned), so peers may hold its routes from the
	// previous run; a first start has nothing to restart (see addPeer).
	restarted bool
	conflicts map[netip.Prefix]bool // logged once each

	mu     sync.Mutex
	status Status
	// routeErr is the last route programming failure ("" after a pass
	// that worked), guarded by mu.
	routeErr string
}

// NewAgent validates the configuration and returns an agent; Run does the
// work.
func NewAgent(d Deps) (*Agent, error) {
	if err := d.Config.Finish(); err != nil {
		return nil, err
	}
	if d.NodeName == "" {
		return nil, errors.New("routing needs the node name")
	}
	if d.Records == nil {
		return nil, errors.New("routing needs the datastore syncer")
	}
	defaultLogDetectResync(&d.Log, &d.DetectAddress, &d.ResyncInterval)
	if d.DetectIPv6 == nil {
		d.DetectIPv6 = DetectIPv6
	}
	return &Agent{
		d:          d,
		log:        d.Log.WithField("component", "bgp"),
		routes:     newKnownRoutes(d.Routes),
		blocks:     map[netip.Prefix]bool{},
		sessions:   map[netip.Addr]PeerSpec{},
		handover:   newHandover(),
		grReadded:  map[netip.Addr]bool{},
		advertised: map[netip.Prefix]bool{},
		conflicts:  map[netip.Prefix]bool{},
	}, nil
}

// defaultLogDetectResync fills in the defaults that the BGP agent and the
// VXLAN manager share: the standard logger, address detection in the
// current network namespace and a 10s resync.
func defaultLogDetectResync(log *logrus.FieldLogger, detect *func(method string) (netip.Addr, error), resync *time.Duration) {
	if *log == nil {
		*log = logrus.StandardLogger()
	}
	if *detect == nil {
		*detect = DetectAddress
	}
	if *resync <= 0 {
		*resync = 10 * time.Second
	}
}

// retry runs fn until it succeeds or ctx ends, backing off: the agent must
// survive a datastore that is not up yet or a port still held by a dying
// predecessor, without blocking the plugin.
func (a *Agent) retry(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	return retry.Until(ctx, retry.Standard(), 0, fn, func(err error, next time.Duration) {
		a.log.WithError(err).Warnf("%s failed, retrying in %s", what, next.Round(time.Millisecond))
	})
}

// Run works until ctx ends, and returns nil then. The start-up steps
// retry until they work; an error means the agent gave up (the stream of
// the node's blocks ended, or it can no longer follow the datastore) and
// routes are programmed no more.
func (a *Agent) Run(ctx context.Context) error {
	err := a.run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (a *Agent) run(ctx context.Context) error {
	a.start = time.Now()
	addr, err := a.detectNodeAddress(ctx)
	if err != nil {
		return fmt.Errorf("detecting the node address: %w", err)
	}
	a.log = a.log.WithField("address", addr.String())
	addr6 := a.ipv6NextHop(addr)

	// The syncer's subscription starts with every record it holds and
	// then has each change, so the reads of the records (from the
	// syncer's memory) miss nothing: a node that registers while this one
	// starts is either in the first read of the nodes or signalled.
	dirty := make(chan string, 8)
	gaveUp := follow.Prefixes(ctx, a.d.Records, "bgp", []string{datastore.NodesPrefix, datastore.BGPPrefix, ipam.PoolsPrefix, datastore.EndpointsPrefix + a.d.NodeName + "/"}, dirty)

	if err := a.startSpeaker(ctx, addr, addr6); err != nil {
		return err
	}
	if err := a.announceInitialState(ctx); err != nil {
		return fmt.Errorf("announcing the node's routes: %w", err)
	}
	return a.reconcileOnChanges(ctx, dirty, gaveUp)
}

// detectNodeAddress is Config.NodeIP, or else the autodetected address,
// retried until found; an error only when ctx ends.
func (a *Agent) detectNodeAddress(ctx context.Context) (netip.Addr, error) {
	var addr netip.Addr
	err := a.retry(ctx, "detecting the node address", func(context.Context) error {
		if a.d.Config.NodeIP != "" {
			addr = netip.MustParseAddr(a.d.Config.NodeIP)
			return nil
		}
		var err error
		addr, err = a.d.DetectAddress(a.d.Config.AutodetectMethod)
		return err
	})
	return addr, err
}

// startSpeaker registers the node, reads the BGP configuration and starts
// the speaker (and the status socket), each retried until it works; an
// error only when ctx ends.
func (a *Agent) startSpeaker(ctx context.Context, addr, addr6 netip.Addr) error {
	if err := a.retry(ctx, "registering the node", func(ctx context.Context) error { return a.register(ctx, addr, addr6) }); err != nil {
		return err
	}
	if err := a.retry(ctx, "reading the BGP configuration", a.loadNodesAndPeers); err != nil {
		return err
	}
	if err := a.retry(ctx, "starting the BGP speaker", func(ctx context.Context) error {
		return a.d.Speaker.Start(ctx, GlobalSpec{
			ASN: a.self.ASN, RouterID: addr, ListenAddress: a.d.Config.ListenAddress,
			Port: a.d.Config.Port, RestartTime: a.d.Config.RestartTime,
		})
	}); err != nil {
		return err
	}
	a.log.WithFields(logrus.Fields{"asn": a.self.ASN, "port": a.d.Config.Port}).Info("BGP speaker started")
	if a.d.Config.StatusSocket != "" {
		go func() {
			if err := serveStatus(ctx, a.d.Config.StatusSocket, a.Status, a.log); err != nil {
				a.log.WithError(err).Warn("BGP status socket failed; `node status` will not work")
			}
		}()
	}
	return nil
}

// announceInitialState exports this host's prefixes, then opens the
// sessions and programs the routes; an error only when ctx ends.
func (a *Agent) announceInitialState(ctx context.Context) error {
	// Our prefixes go out before any session exists: a peer that kept our
	// routes through our restart drops whatever we have not re-announced by
	// our End-of-RIB, which gobgp sends right after the initial update.
	if err := a.retry(ctx, "reading this host's blocks", a.loadInitialExports); err != nil {
		return err
	}
	if err := a.retry(ctx, "reading the IP pools", a.loadPools); err != nil {
		return err
	}
	a.syncExports(ctx)
	if kernel, err := a.routes.ListLearned(ctx); err == nil && len(kernel) > 0 {
		a.restarted = true // routes learned by a previous run
	}
	a.syncPeers(ctx)
	a.syncRoutes(ctx)
	return nil
}

// pendingPass is what the events since the last pass ask the next one to
// reload and resync.
type pendingPass struct {
	reloadNodes, reloadPools, reloadEndpoints, exports bool
	// resync: the periodic pass, which also reads the kernel's routes
	// again instead of trusting what routing last programmed.
	resync bool
}

// markDirty notes a change under one of the followed datastore prefixes.
func (p *pendingPass) markDirty(prefix string) {
	switch prefix {
	case datastore.NodesPrefix, datastore.BGPPrefix:
		p.reloadNodes = true
	case ipam.PoolsPrefix:
		p.reloadPools = true
	default:
		p.reloadEndpoints = true
	}
}

// reconcileOnChanges runs a pass after every burst of block events,
// datastore changes and speaker changes, and every ResyncInterval, until
// ctx ends (its error), the stream of the node's blocks ends or a follower
// of the datastore gives up (gaveUp).
func (a *Agent) reconcileOnChanges(ctx context.Context, dirty <-chan string, gaveUp <-chan error) error {
	a.blockEvents = a.d.Blocks.WatchHostBlocks(ctx, a.d.NodeName)
	ticker := time.NewTicker(a.d.ResyncInterval)
	defer ticker.Stop()
	lastPass := time.Now()
	for {
		var pass pendingPass
		onBlock := func(ev ipam.BlockEvent, ok bool) {
			if !ok {
				a.blockEvents, a.blocksEnded = nil, true
				return
			}
			a.applyBlockEvent(ev)
			pass.exports = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-gaveUp:
			return err
		case ev, ok := <-a.blockEvents:
			onBlock(ev, ok)
		case prefix := <-dirty:
			pass.markDirty(prefix)
		case <-a.d.Speaker.Changes():
			a.spacePasses(ctx, lastPass)
		case <-ticker.C:
			pass.reloadNodes, pass.reloadPools, pass.reloadEndpoints, pass.resync = true, true, true, true
		}
		// Drain what else is queued so a burst costs one reconcile.
		for drained := false; !drained; {
			select {
			case ev, ok := <-a.blockEvents:
				onBlock(ev, ok)
			case prefix := <-dirty:
				pass.markDirty(prefix)
			default:
				drained = true
			}
		}
		if a.blocksEnded {
			return ipam.ErrHostBlocksEnded
		}
		a.runPass(ctx, pass)
		lastPass = time.Now()
	}
}

// runPass reloads what pass asks for and resyncs exports, peers and
// routes; a failed reload is logged and the pass goes on with what it has.
func (a *Agent) runPass(ctx context.Context, pass pendingPass) {
	if pass.resync {
		a.routes.forget()
	}
	if pass.reloadNodes {
		if err := a.loadNodesAndPeers(ctx); err != nil {
			a.log.WithError(err).Warn("reloading nodes and BGP peers")
		}
	}
	if pass.reloadPools {
		if err := a.loadPools(ctx); err != nil {
			a.log.WithError(err).Warn("reloading IP pools")
		}
	}
	if pass.reloadEndpoints {
		if err := a.loadEndpoints(ctx); err != nil {
			a.log.WithError(err).Warn("reloading local endpoints")
		}
		pass.exports = true
	}
	if pass.exports || pass.reloadNodes || a.exportsDirty {
		a.exportsDirty = false
		a.syncExports(ctx)
	}
	if pass.reloadNodes {
		a.syncPeers(ctx)
	}
	a.syncRoutes(ctx)
}

// minPassInterval spaces the passes that speaker events start. A pass
// selects and diffs every learned path, and may list the sessions or the
// RIB from gobgp (on its server goroutine, the one that also handles
// updates); during a burst (a route from every one of 63 peers within a
// second) one pass per update kept every daemon busy and delayed the
// updates themselves. The first event after a quiet spell is handled at
// once; the ones in a burst are coalesced into a pass every
// minPassInterval.
const minPassInterval = 50 * time.Millisecond

func (a *Agent) spacePasses(ctx context.Context, lastPass time.Time) {
	wait := minPassInterval - time.Since(lastPass)
	if wait <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(wait):
	}
	// What arrived while waiting is covered by this pass.
	select {
	case <-a.d.Speaker.Changes():
	default:
	}
}

// ipv6NextHop is the configured or detected IPv6 next hop; invalid when
// IPv6 routing is off or the node has no global IPv6 address.
func (a *Agent) ipv6NextHop(v4 netip.Addr) netip.Addr {
	switch a.d.Config.NodeIPv6 {
	case NoIPv6:
		return netip.Addr{}
	case "":
		addr6, ok, err := a.d.DetectIPv6(v4)
		if err != nil || !ok {
			a.log.WithError(err).Info("no global IPv6 address next to the BGP address: IPv6 prefixes are neither advertised nor learned")
			return netip.Addr{}
		}
		a.log.WithField("ipv6", addr6.String()).Info("IPv6 next hop detected")
		return addr6
	default:
		return netip.MustParseAddr(a.d.Config.NodeIPv6)
	}
}

// register writes this node's record: its name and address, and the ASN
// when configured; the route-reflector settings (`bgp config`) are kept.
func (a *Agent) register(ctx context.Context, addr, addr6 netip.Addr) error {
	want, changed, rev, err := follow.UpdateNode(ctx, a.d.Store, a.d.NodeName, func(n *datastore.Node) {
		// A record with an address: this node ran before.
		a.restarted = n.IPv4 != ""
		n.Name, n.IPv4, n.IPv6 = a.d.NodeName, addr.String(), ""
		if addr6.IsValid() {
			n.IPv6 = addr6.String()
		}
		if a.d.Config.ASN != 0 {
			n.ASN = a.d.Config.ASN
		}
	})
	if err != nil {
		return err
	}
	if changed {
		a.log.WithFields(logrus.Fields{"node": want.Name, "asn": want.ASN}).Info("node registered")
	}
	// What follows reads the syncer's memory: it must hold this write.
	return a.d.Records.WaitRevision(ctx, rev)
}

// loadNodesAndPeers reads nodes, explicit peers and the BGP config, and
// refreshes self (route-reflector settings may change at run time).
func (a *Agent) loadNodesAndPeers(ctx context.Context) error {
	var cfg datastore.BGPConfig
	if r, ok := a.d.Records.Get(datastore.BGPConfigKey); ok {
		if c, ok := r.Value.(*datastore.BGPConfig); ok {
			cfg = *c
		} else {
			a.log.WithError(r.Err).Warn("ignoring an unreadable BGP config record")
		}
	}
	nodes := follow.Nodes(a.d.Records)
	var me *datastore.Node
	for i := range nodes {
		if nodes[i].Name == a.d.NodeName {
			me = &nodes[i]
		}
	}
	precs, _ := a.d.Records.List(datastore.BGPPeersPrefix)
	var peers []datastore.BGPPeer
	for _, p := range datastore.Values[datastore.BGPPeer](precs) {
		peers = append(peers, *p)
	}
	a.nodes, a.peers, a.cfg = nodes, peers, cfg
	if me != nil {
		asn := EffectiveASN(*me, cfg)
		if a.self.ASN != 0 && asn != a.self.ASN {
			a.log.WithFields(logrus.Fields{"running": a.self.ASN, "configured": asn}).Warn("this node's AS number changed: restart the daemon to apply it")
			asn = a.self.ASN
		}
		addr, _ := netip.ParseAddr(me.IPv4)
		if a.self.Address.IsValid() && addr != a.self.Address {
			addr = a.self.Address // the speaker runs with the address it started with
		}
		addr6, _ := netip.ParseAddr(me.IPv6)
		if a.self.Address.IsValid() {
			addr6 = a.self.Address6 // likewise
		}
		a.self = Self{Name: me.Name, Address: addr, Address6: addr6, ASN: asn, RouteReflector: me.RouteReflector, ClusterID: me.ClusterID}
		if a.self.RouteReflector && a.self.ClusterID == "" {
			a.self.ClusterID = addr.String()
		}
	}
	if !a.self.Address.IsValid() {
		return fmt.Errorf("node record %s is missing", datastore.NodeKey(a.d.NodeName))
	}
	return nil
}

func (a *Agent) loadPools(context.Context) error {
	recs, _ := a.d.Records.List(ipam.PoolsPrefix)
	var out []netip.Prefix
	for _, p := range datastore.Values[ipam.PoolInfo](recs) {
		out = append(out, p.Prefix.Masked())
	}
	a.pools = out
	return nil
}

func (a *Agent) loadInitialExports(ctx context.Context) error {
	recs, _ := a.d.Records.List(ipam.HostAffinityPrefix(a.d.NodeName))
	for _, b := range datastore.Values[ipam.BlockAffinity](recs) {
		if b.Confirmed {
			a.blocks[b.Block.Masked()] = true
		}
	}
	return a.loadEndpoints(ctx)
}

func (a *Agent) loadEndpoints(context.Context) error {
	recs, _ := a.d.Records.List(datastore.EndpointsPrefix + a.d.NodeName + "/")
	var ips []netip.Addr
	for _, ep := range datastore.Values[datastore.WorkloadEndpoint](recs) {
		ips = append(ips, ep.Addrs()...)
	}
	a.workIPs = ips
	return nil
}

func (a *Agent) applyBlockEvent(ev ipam.BlockEvent) {
	p, ok := nlconv.PrefixFromIPNet(ev.Block)
	if !ok {
		return
	}
	if ev.Added {
		a.blocks[p] = true
	} else {
		delete(a.blocks, p)
	}
}

// syncExports makes the speaker originate exactly DesiredExports.
func (a *Agent) syncExports(ctx context.Context) {
	blocks := make([]netip.Prefix, 0, len(a.blocks))
	for b := range a.blocks {
		blocks = append(blocks, b)
	}
	want := DesiredExports(blocks, a.workIPs, a.self.Address6.IsValid())
	wantSet := map[netip.Prefix]bool{}
	for _, p := range want {
		wantSet[p] = true
		if a.advertised[p] {
			continue
		}
		nextHop := a.self.Address
		if p.Addr().Is6() {
			nextHop = a.self.Address6
		}
		if err := a.d.Speaker.Advertise(ctx, p, nextHop); err != nil {
			a.log.WithError(err).WithField("prefix", p.String()).Warn("advertising")
			continue
		}
		a.advertised[p] = true
		a.log.WithField("prefix", p.String()).Info("advertising")
	}
	for p := range a.advertised {
		if wantSet[p] {
			continue
		}
		if err := a.d.Speaker.Withdraw(ctx, p); err != nil {
			a.log.WithError(err).WithField("prefix", p.String()).Warn("withdrawing")
			continue
		}
		delete(a.advertised, p)
		a.log.WithField("prefix", p.String()).Info("withdrawn")
	}
}

// syncPeers makes the speaker's sessions match DesiredPeers, make before
// break (handover.go): new and re-created sessions first, sessions whose
// peer still exists retire instead of going at once.
func (a *Agent) syncPeers(ctx context.Context) {
	want := a.resolveSecrets(DesiredPeers(a.self, a.nodes, a.peers, a.cfg))
	plan := planPeers(a.sessions, want, a.peerAddresses())
	now := time.Now()
	for _, p := range want {
		if a.handover.retiring[p.Address] != nil {
			a.log.WithField("peer", p.String()).Info("BGP peer wanted again: no longer retiring")
			delete(a.handover.retiring, p.Address)
		}
	}
	for _, p := range plan.Relabel {
		a.sessions[p.Address] = p
		a.log.WithField("peer", p.String()).Info("BGP peer changed role; same session")
	}
	for _, p := range plan.Rekey {
		cur := a.sessions[p.Address]
		if err := a.d.Speaker.DeletePeer(ctx, p.Address); err != nil {
			a.log.WithError(err).WithField("peer", cur.String()).Warn("re-creating BGP peer")
			continue
		}
		delete(a.sessions, p.Address)
		a.addPeer(ctx, p, now, "BGP peer re-created with new settings", true)
	}
	// A new session is pending (holding deletions) only as part of a
	// topology change: a node that joins takes nothing away, and one that
	// never comes up must not delay real withdrawals.
	change := len(plan.Rekey)+len(plan.Relabel)+len(plan.Retire) > 0
	for _, p := range plan.Add {
		a.addPeer(ctx, p, now, "BGP peer added", change)
	}
	for _, addr := range plan.Remove {
		a.removePeer(ctx, addr, "BGP peer removed")
	}
	for _, addr := range plan.Retire {
		if a.handover.retiring[addr] == nil {
			a.handover.retire(addr, now)
			a.log.WithField("peer", a.sessions[addr].String()).Info("BGP peer retiring: kept until other sessions carry its routes")
		}
	}
}

// addPeer configures p; after the first sync, when pending, it holds
// kernel deletions until it has sent its routes. Only a node that ran before announces a restart: the
// flag makes gobgp hold back every advertisement to the peer until all
// peers have sent End-of-RIB (or 5 s per session), a delay that buys
// nothing when no peer kept routes of ours.
func (a *Agent) addPeer(ctx context.Context, p PeerSpec, now time.Time, msg string, pending bool) {
	p.Restarting = a.restarted && !a.synced
	if err := a.d.Speaker.AddPeer(ctx, p); err != nil {
		a.log.WithError(err).WithField("peer", p.String()).Warn("adding BGP peer")
		return
	}
	a.sessions[p.Address] = p
	if a.synced && pending {
		a.handover.pending[p.Address] = now
	}
	a.log.WithFields(logrus.Fields{"peer": p.String(), "md5": p.Password != ""}).Info(msg)
}

func (a *Agent) removePeer(ctx context.Context, addr netip.Addr, msg string) {
	cur := a.sessions[addr]
	if err := a.d.Speaker.DeletePeer(ctx, addr); err != nil {
		a.log.WithError(err).WithField("peer", cur.String()).Warn("removing BGP peer")
		return
	}
	delete(a.sessions, addr)
	a.handover.forget(addr)
	delete(a.grReadded, addr)
	a.log.WithField("peer", cur.String()).Info(msg)
}

// peerAddresses: every address that belongs to a node or a peer record
// (a session to any other address has lost its peer). A peer whose secret
// cannot be read counts as gone: its session must not outlive its key.
func (a *Agent) peerAddresses() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, n := range a.nodes {
		if addr, err := netip.ParseAddr(n.IPv4); err == nil {
			out[addr] = true
		}
	}
	for _, p := range a.peers {
		if _, unreadable := a.secretProblems[p.Name]; unreadable {
			continue
		}
		if addr, err := netip.ParseAddr(p.PeerIP); err == nil {
			out[addr] = true
		}
	}
	return out
}

// advanceHandover removes the retired sessions whose routes others carry
// now and ends the pending state of sessions that have synced.
func (a *Agent) advanceHandover(ctx context.Context, paths []LearnedPath, pol ImportPolicy, states []PeerState) {
	if a.handover.idle() {
		return
	}
	accept := func(p LearnedPath) bool { return pol.Decide(p) == "" }
	step := a.handover.advance(paths, accept, states, time.Now(), a.d.Config.SyncTimeout)
	for _, addr := range step.Synced {
		delete(a.handover.pending, addr)
		a.log.WithField("peer", a.sessions[addr].String()).Info("BGP peer synced: its routes are in")
	}
	for _, addr := range step.Remove {
		a.removePeer(ctx, addr, "retired BGP peer removed: its routes come over other sessions now")
	}
	for _, addr := range step.TimedOut {
		if a.handover.retiring[addr] != nil {
			a.removePeer(ctx, addr, "retired BGP peer removed after the sync timeout; routes only it carried go")
			continue
		}
		delete(a.handover.pending, addr)
		a.log.WithField("peer", a.sessions[addr].String()).Warn("new BGP session not synced within the sync timeout; stale learned routes may go now")
	}
}

// restoreRestartFlag: gobgp ends its own restart state for every configured
// session once the sessions that are up have sent their End-of-RIB, also
// for sessions that have not connected yet, which then come up without the
// Restart State bit (the peer logs "restart flag is not set" and, RFC 4724
// aside, may drop the routes it kept for us). While this node still syncs,
// such a session is re-created (once) with the flag, so that every session
// of a restarting node restarts gracefully.
func (a *Agent) restoreRestartFlag(ctx context.Context, states []PeerState) {
	if a.synced {
		return
	}
	for _, s := range states {
		spec, ok := a.sessions[s.Address]
		if !ok || !spec.Restarting || s.State == "Established" || s.LocalRestarting || a.grReadded[s.Address] {
			continue
		}
		a.grReadded[s.Address] = true
		if err := a.d.Speaker.DeletePeer(ctx, s.Address); err != nil {
			a.log.WithError(err).WithField("peer", spec.String()).Warn("re-creating BGP peer to restart gracefully")
			continue
		}
		if err := a.d.Speaker.AddPeer(ctx, spec); err != nil {
			delete(a.sessions, s.Address)
			a.log.WithError(err).WithField("peer", spec.String()).Warn("re-creating BGP peer to restart gracefully")
			continue
		}
		a.log.WithField("peer", spec.String()).Debug("BGP peer re-created with the restart flag (not connected when the speaker ended its restart)")
	}
}

// resolveSecrets reads the password of every peer whose record names a
// secret, on every sync, so that a changed file re-keys the session. A peer
// whose secret cannot be read gets no session: without its key the peer
// would refuse it anyway, and a session without MD5 must never be offered.
func (a *Agent) resolveSecrets(peers []PeerSpec) []PeerSpec {
	out := peers[:0]
	problems := map[string]string{}
	for _, p := range peers {
		if p.PasswordSecret != "" {
			pw, err := ReadSecret(a.d.Config.SecretsDir, p.PasswordSecret)
			if err != nil {
				problems[p.Name] = err.Error()
				continue
			}
			p.Password = pw
		}
		out = append(out, p)
	}
	for name, msg := range problems {
		if a.secretProblems[name] != msg {
			a.log.WithField("peer", name).Error("BGP peer not configured: " + msg)
		}
	}
	a.secretProblems = problems
	return out
}

// syncRoutes runs the import policy over the RIB and programs the result.
func (a *Agent) syncRoutes(ctx context.Context) {
	// The sessions first, then the RIB: the paths read after a session is
	// seen with its End-of-RIB hold every route it sent before it. Read
	// the other way round, a session that synced in between counted as
	// synced while its routes were missing from the paths, and the pass
	// withdrew them from the kernel (to install them again the next pass).
	read := a.readSpeaker(ctx)
	states, statesErr, paths, err := read.states, read.statesErr, read.paths, read.pathsErr
	if ctx.Err() != nil {
		return // stopping
	}
	if err != nil {
		a.log.WithError(err).Warn("reading the RIB")
		return
	}
	nodes := map[netip.Addr]string{}
	nodeIPv6 := map[string]netip.Addr{}
	for _, n := range a.nodes {
		if n.Name == a.d.NodeName {
			continue
		}
		if addr, err := netip.ParseAddr(n.IPv4); err == nil {
			nodes[addr] = n.Name
		}
		if addr, err := netip.ParseAddr(n.IPv6); err == nil && addr.Is6() {
			nodes[addr] = n.Name
			nodeIPv6[n.Name] = addr
		}
	}
	pol := ImportPolicy{Self: a.self, Pools: a.pools, Nodes: nodes, NodeIPv6: nodeIPv6, Peers: a.sessions, Exports: a.advertised}
	sel := Select(paths, pol)
	leaveToVXLAN(sel.Routes, a.d.VXLAN)
	if statesErr != nil {
		a.log.WithError(statesErr).Warn("reading BGP sessions")
	}
	a.restoreRestartFlag(ctx, states)
	if !a.synced {
		a.synced = a.allPeersSynced(states) || time.Since(a.start) > a.d.Config.SyncTimeout
		if a.synced {
			a.log.WithField("after", time.Since(a.start).Round(time.Millisecond).String()).Info("BGP in sync: stale learned routes may now be removed")
		}
	}
	a.advanceHandover(ctx, paths, pol, states)
	kernel, err := a.routes.ListLearned(ctx)
	if err != nil {
		a.log.WithError(err).Warn("listing kernel routes")
		a.setRouteError(err)
		return
	}
	diff := DiffRoutes(sel.Routes, kernel, a.synced && a.handover.idle())
	conflicts, err := ApplyDiff(ctx, a.routes, diff, a.log)
	if len(diff.Kept) > 0 {
		// Routes kept while deletes wait may meanwhile be replaced by their
		// other owners (a claimed block's blackhole, a workload, VXLAN):
		// read the kernel until the deletes are allowed.
		a.routes.forget()
	}
	if err != nil {
		a.log.WithError(err).Warn("programming learned routes")
	}
	a.setRouteError(err)
	for _, p := range conflicts {
		// Repeats on every pass until the other route goes: say it once.
		if !a.conflicts[p] {
			a.conflicts[p] = true
			a.log.WithField("dst", p.String()).Warn("a learned route collides with a route routing does not own (blackhole, workload or admin route); left alone")
		}
	}
	a.updateStatus(sel, states)
}

// speakerRead is what readSpeaker got.
type speakerRead struct {
	states    []PeerState
	statesErr error
	paths     []LearnedPath
	pathsErr  error
}

// readSpeaker reads the sessions, then the RIB (in that order, see
// syncRoutes). When they list them (after a session event; see GoBGP.Peers
// and ribMirror), both reads wait their turn on gobgp's server loop behind
// every update queued there: on a route reflector while 64 nodes claim
// blocks at once, 1-3 s. A block claimed on this node meanwhile waited for
// the pass to end before it was advertised, and in the scale bench the
// reflector's own block was the last route of the run, 2-4 s after its
// claim. So the reads run aside, and while they wait this node's block
// events are applied and exported at once.
func (a *Agent) readSpeaker(ctx context.Context) speakerRead {
	done := make(chan speakerRead, 1)
	go func() {
		var r speakerRead
		r.states, r.statesErr = a.d.Speaker.Peers(ctx)
		r.paths, r.pathsErr = a.d.Speaker.Paths(ctx)
		done <- r
	}()
	for {
		select {
		case r := <-done:
			return r
		case <-ctx.Done():
			return speakerRead{statesErr: ctx.Err(), pathsErr: ctx.Err()}
		case ev, ok := <-a.blockEvents:
			if !ok {
				a.blockEvents, a.blocksEnded = nil, true
				continue
			}
			a.applyBlockEvent(ev)
			a.syncExports(ctx)
			a.exportsDirty = true // a failed advertisement is retried next pass
		}
	}
}

// allPeersSynced: every session is up and has sent its End-of-RIB.
func (a *Agent) allPeersSynced(states []PeerState) bool {
	byAddr := map[netip.Addr]PeerState{}
	for _, s := range states {
		byAddr[s.Address] = s
	}
	for addr := range a.sessions {
		s, ok := byAddr[addr]
		if !ok || s.State != "Established" || !s.EORReceived {
			return false
		}
	}
	return true
}

func (a *Agent) updateStatus(sel Selection, states []PeerState) {
	st := Status{
		Node: a.self.Name, Address: a.self.Address.String(), ASN: a.self.ASN,
		RouteReflector: a.self.RouteReflector, ClusterID: a.self.ClusterID,
		Mesh: a.cfg.MeshEnabled(), Synced: a.synced,
		Peers: []PeerStatus{}, Advertised: []string{}, Routes: []RouteStatus{}, Rejected: sel.Rejected,
	}
	if a.self.Address6.IsValid() {
		st.IPv6NextHop = a.self.Address6.String()
	}
	byAddr := map[netip.Addr]PeerState{}
	for _, s := range states {
		byAddr[s.Address] = s
	}
	for addr, spec := range a.sessions {
		ps := byAddr[addr]
		counts := sel.PerPeer[addr]
		row := PeerStatus{
			Address: addr.String(), Name: spec.Name, ASN: spec.ASN, Type: spec.Type, State: ps.State,
			Since: ps.Since, Received: counts.Received, Accepted: counts.Accepted, Advertised: ps.Advertised,
		}
		if row.State == "" {
			row.State = "Unknown"
		}
		st.Peers = append(st.Peers, row)
	}
	slices.SortFunc(st.Peers, func(x, y PeerStatus) int {
		ax, _ := netip.ParseAddr(x.Address)
		ay, _ := netip.ParseAddr(y.Address)
		return ax.Compare(ay)
	})
	for p := range a.advertised {
		st.Advertised = append(st.Advertised, p.String())
	}
	slices.Sort(st.Advertised)
	var dsts []netip.Prefix
	for p := range sel.Routes {
		dsts = append(dsts, p)
	}
	slices.SortFunc(dsts, nlconv.ComparePrefix)
	for _, p := range dsts {
		st.Routes = append(st.Routes, RouteStatus{Dst: p.String(), Via: addrStrings(sel.Routes[p])})
	}
	a.mu.Lock()
	a.status = st
	a.mu.Unlock()
}

// Status returns the last reconciled state, with uptimes computed now.
func (a *Agent) Status(context.Context) Status {
	a.mu.Lock()
	st := a.status
	st.Peers = slices.Clone(st.Peers)
	st.RouteError = a.routeErr
	a.mu.Unlock()
	for i := range st.Peers {
		if !st.Peers[i].Since.IsZero() {
			st.Peers[i].Uptime = FormatUptime(time.Since(st.Peers[i].Since))
		}
	}
	st.VXLAN = vxlanStatus(a.d.VXLAN)
	return st
}

func (a *Agent) setRouteError(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.routeErr = ""
	if err != nil {
		a.routeErr = err.Error()
	}
}
