package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/await"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// Dataplane is what the syncer programs: *NFT, or a fake in tests.
type Dataplane interface {
	// Apply makes the tables equal to want and says how many changes it
	// made (0: they already were).
	Apply(ctx context.Context, want Ruleset) (int, error)
}

// NameResolver finds the name of a Docker network, by id, in this host's
// Docker. found is false when Docker does not know the id (another host's
// network, or one being created right now).
type NameResolver interface {
	NetworkName(ctx context.Context, id string) (name string, found bool, err error)
}

// Config wires a Syncer.
type Config struct {
	// Store takes the names the syncer fills in; Records (the datastore
	// syncer) is what it follows.
	Store     *datastore.Store
	Records   datastore.Records
	Node      string
	Dataplane Dataplane
	// Names, when set, fills in the Name of network records that lack one
	// (see NetworkKey); nil leaves names to others.
	Names NameResolver
	// IPv6 programs the ip6 table too.
	IPv6 bool
	// Failsafe are the ports host endpoint policy leaves open; nil:
	// DefaultFailsafe.
	Failsafe *Failsafe
	// ResyncInterval is how often the kernel is compared with the records
	// and repaired (somebody else changed our tables). The records
	// themselves come from watches, re-listed whenever a watch breaks.
	ResyncInterval time.Duration
	Log            logrus.FieldLogger
}

// Timing of the syncer's retries.
const (
	defaultResync   = 30 * time.Second
	nameRetryMin    = 250 * time.Millisecond
	nameRetryMax    = 5 * time.Minute
	nameCallTimeout = 10 * time.Second
)

// Syncer keeps the tables in step with the datastore: it follows pools,
// networks, endpoints, nodes and the policy resources with etcd watches
// (re-listing when a watch breaks) and applies the desired tables after
// every burst of changes.
type Syncer struct {
	cfg Config
	log logrus.FieldLogger

	// passedRev is the datastore revision of the newest event a finished
	// pass has taken in: tests wait on it before asserting what a change
	// did not cause. seenRev is the loop's running maximum.
	passedRev atomic.Int64
	seenRev   int64

	// mu guards what WaitProgrammed and Health read.
	mu sync.Mutex
	// programmed is the datastore revision of the endpoint records the
	// kernel's tables reflect: every endpoint change up to it is in.
	programmed int64
	// advanced is closed (and replaced) whenever programmed grows or the
	// health changes.
	advanced chan struct{}
	// unhealthy says why the tables are not in step ("" when they are).
	unhealthy string
}

// NewSyncer checks cfg.
func NewSyncer(cfg Config) (*Syncer, error) {
	if cfg.Store == nil || cfg.Dataplane == nil {
		return nil, errors.New("policy syncer needs a datastore and a dataplane")
	}
	if cfg.Node == "" {
		return nil, errors.New("policy syncer needs this host's node name")
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = defaultResync
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.Failsafe == nil {
		fs := DefaultFailsafe()
		cfg.Failsafe = &fs
	}
	return &Syncer{cfg: cfg, log: cfg.Log.WithField("component", "policy"), advanced: make(chan struct{}), unhealthy: "the datastore has not been read yet"}, nil
}

// ErrNotProgrammed: the kernel's tables could not be brought in step in
// time.
var ErrNotProgrammed = errors.New("network policy not programmed")

// WaitProgrammed returns once the kernel's tables include every endpoint
// record change up to datastore revision rev (the Join's own write), or
// fails when ctx ends first, saying why programming lags.
func (s *Syncer) WaitProgrammed(ctx context.Context, rev int64) error {
	why := ""
	err := await.Until(ctx, func() (bool, <-chan struct{}, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		why = s.unhealthy
		return s.programmed >= rev, s.advanced, nil
	})
	if err != nil {
		if why == "" {
			why = "still applying"
		}
		return fmt.Errorf("%w: the endpoint's rules are not in the kernel (%s): %w", ErrNotProgrammed, why, err)
	}
	return nil
}

// Health is nil while the tables are in step with the datastore, else why
// not (for /healthz).
func (s *Syncer) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unhealthy != "" {
		return fmt.Errorf("%w: %s", ErrNotProgrammed, s.unhealthy)
	}
	return nil
}

func (s *Syncer) setProgrammed(rev int64, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := why != s.unhealthy
	s.unhealthy = why
	if why == "" && rev > s.programmed {
		s.programmed = rev
		changed = true
	}
	if changed {
		close(s.advanced)
		s.advanced = make(chan struct{})
	}
}

// followed are the prefixes whose records Desired reads: each but the
// policy kinds followed by its own watch; the policy kinds (policyKinds)
// together.
var followed = append([]string{ipam.PoolsPrefix, datastore.NetworksPrefix, datastore.EndpointsPrefix, datastore.NodesPrefix}, policyKinds...)

// policyKinds are the prefixes of the policy resources under api.Prefix.
// One apply -f writes several kinds in one transaction (a host endpoint
// and the policy that opens it, a policy and the network set it names),
// and a pass must see all of it or none: one per-kind watch delivering
// its event before another would program the endpoint with its default
// deny and without its policy for a moment. So they are followed as one:
// each change re-reads api.Prefix whole, at one revision.
var policyKinds = []string{api.PoliciesPrefix, api.HostEndpointsPrefix, api.NetworkSetsPrefix}

// update is what a prefix follower tells the main loop: a full snapshot
// (after a (re-)list) or one event.
type update struct {
	prefix   string
	snapshot map[string][]byte // non-nil: replaces the prefix's records
	rev      int64             // the snapshot's revision
	event    *datastore.Event
	// snapshots, from the policy follower, replace several prefixes'
	// records at once (prefix and snapshot are then unused; rev is the
	// revision of the event that caused the list).
	snapshots map[string]map[string][]byte
}

// Run syncs until ctx is done. Until the datastore has been read once the
// kernel is left as it is: the previous run's rules keep protecting the
// running containers. It returns an error when the datastore syncer
// stopped while ctx is live (the tables would follow no change).
func (s *Syncer) Run(ctx context.Context) error {
	if s.cfg.Records == nil {
		return errors.New("policy syncer needs the datastore syncer")
	}
	ctx, cancel := context.WithCancel(ctx)
	// Returning waits for the helpers: nothing of the syncer uses the
	// datastore or Docker after Run.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// One subscription: the changes of one transaction (an apply -f of a
	// host endpoint and the policy that opens it) come in one batch.
	sub := s.cfg.Records.Subscribe(ctx, "policy", followed...)
	ss := &syncState{
		records: map[string]map[string][]byte{},
		loaded:  map[string]bool{},
		delay:   retry.New(retry.Standard()),
		warned:  map[string]bool{},
		names:   s.startNames(ctx, &wg),
	}
	ticker := time.NewTicker(s.cfg.ResyncInterval)
	defer ticker.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case <-sub.Ended():
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("network policy: %w", datastore.ErrSyncerStopped)
		case <-sub.Ready():
			ss.take(s, sub.Take())
		case <-ss.retryC:
			ss.retryTimer, ss.retryC = nil, nil
			force = true
		case <-ticker.C:
			force = true
		}
		s.apply(ctx, ss, force)
		s.passedRev.Store(s.seenRev)
	}
}

// take hands the calculation a batch of the syncer's changes, each
// decoded once by the syncer.
func (ss *syncState) take(s *Syncer, b datastore.Batch) {
	s.seenRev = max(s.seenRev, b.Revision)
	ss.epRev = max(ss.epRev, b.Revision)
	if b.InSync {
		for _, p := range followed {
			ss.loaded[p] = true
		}
	}
	if len(b.Changes) == 0 {
		return
	}
	ss.changed = true
	calc := ss.calculator(s)
	for _, c := range b.Changes {
		switch {
		case c.Deleted():
			calc.OnUpdate(c.Key, nil)
		case c.New.Err != nil:
			calc.OnUpdate(c.Key, c.New.Err)
		default:
			calc.OnUpdate(c.Key, calcValue(c.New.Value))
		}
	}
}

// syncState is what Run keeps from one pass to the next.
type syncState struct {
	records map[string]map[string][]byte // by prefix, then key
	loaded  map[string]bool              // prefixes listed at least once
	epRev   int64                        // the endpoint records' revision that records holds
	// changed says the records changed since the last pass that applied
	// them; inStep that such a pass succeeded (false after a failure).
	// Together they skip passes that cannot change the tables (Desired
	// is a function of the records).
	changed, inStep bool
	delay           *retry.Backoff
	retryTimer      *time.Timer // a retry of a failed apply is pending
	retryC          <-chan time.Time
	warned          map[string]bool      // the problems logged, while they last
	names           chan map[string]bool // to resolveNames; nil without a NameResolver
	// calc computes the tables from the records' changes; merge feeds it
	// (see calculator).
	calc *incrementalCalc
}

// calculator is ss's Calculator, made at first use.
func (ss *syncState) calculator(s *Syncer) *incrementalCalc {
	if ss.calc == nil {
		ss.calc = newIncrementalCalc(s.cfg.Node, s.cfg.IPv6, *s.cfg.Failsafe)
	}
	return ss.calc
}

// startNames starts the name resolver given a NameResolver (names is nil
// otherwise); wg counts it.
func (s *Syncer) startNames(ctx context.Context, wg *sync.WaitGroup) (names chan map[string]bool) {
	if s.cfg.Names == nil {
		return nil
	}
	names = make(chan map[string]bool, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.resolveNames(ctx, names)
	}()
	return names
}

// Resyncer is a Dataplane that remembers what it programmed (*NFT):
// Resync makes its next Apply compare with the kernel's tables again.
type Resyncer interface {
	Resync()
}

// apply programs the tables the records call for, unless the records did
// not change since they were last applied (force: the periodic resync or
// a retry, which compares with the kernel's tables anyway). A failure is
// retried with backoff.
func (s *Syncer) apply(ctx context.Context, ss *syncState, force bool) {
	if len(ss.loaded) < len(followed) {
		return // not everything read yet: a partial view would drop rules
	}
	rev := ss.epRev
	if !force && !ss.changed && ss.inStep {
		s.setProgrammed(rev, "")
		return
	}
	calc := ss.calculator(s)
	want, warnings := calc.CompleteDeferredWork()
	ss.warnOnce(s.log, warnings)
	if ss.names != nil {
		offerNames(ss.names, unnamedNetworks(calc.networks.list()))
	}
	if r, ok := s.cfg.Dataplane.(Resyncer); ok && (force || !ss.inStep) {
		r.Resync()
	}
	ss.changed = false
	start := time.Now()
	n, err := s.cfg.Dataplane.Apply(ctx, want)
	if err != nil {
		if ctx.Err() != nil {
			ss.inStep = false
			return
		}
		next := ss.delay.Next()
		s.log.WithError(err).WithField("retryIn", next).Error("programming the nftables policy failed")
		s.setProgrammed(0, "programming nftables failed: "+err.Error())
		ss.inStep = false
		if ss.retryTimer == nil {
			ss.retryTimer = time.NewTimer(next)
			ss.retryC = ss.retryTimer.C
		}
		return
	}
	ss.delay.Reset()
	ss.inStep = true
	s.setProgrammed(rev, "")
	if n > 0 {
		s.log.WithFields(logrus.Fields{"changes": n, "took": time.Since(start).Round(time.Microsecond), "localEndpoints": calc.LocalEndpoints()}).Info("nftables policy updated")
	}
}

// warnOnce logs each problem once while it lasts, not at every burst.
func (ss *syncState) warnOnce(log logrus.FieldLogger, problems []string) {
	now := map[string]bool{}
	for _, w := range problems {
		now[w] = true
		if !ss.warned[w] {
			log.Warn(w)
		}
	}
	ss.warned = now
}

// merge takes u into the records, noting whether they changed and the
// endpoint records' revision.
func (ss *syncState) merge(s *Syncer, u update) {
	// The records u replaces, to hand the calculation only what changed.
	before := map[string]map[string][]byte{}
	if u.snapshot != nil {
		before[u.prefix] = ss.records[u.prefix]
	}
	for prefix := range u.snapshots {
		before[prefix] = ss.records[prefix]
	}
	rev, changed := s.merge(ss.records, ss.loaded, u)
	ss.epRev = max(ss.epRev, rev)
	ss.changed = ss.changed || changed
	if !changed {
		return
	}
	calc := ss.calculator(s)
	if u.event != nil {
		calc.OnUpdate(u.event.Key, decodeRecord(u.prefix, u.event.Key, ss.records[u.prefix][u.event.Key], u.event.Type == datastore.EventDelete))
		return
	}
	for prefix, old := range before {
		now := ss.records[prefix]
		for k, v := range now {
			if ov, ok := old[k]; !ok || !bytes.Equal(ov, v) {
				calc.OnUpdate(k, decodeRecord(prefix, k, v, false))
			}
		}
		for k := range old {
			if _, ok := now[k]; !ok {
				calc.OnUpdate(k, nil)
			}
		}
	}
}

// decodeRecord is the value a Calculator takes for a record of prefix:
// the decoded record, the error of one that does not decode, or nil for
// a deletion. It decodes with the syncer's decoders (RecordKinds), so a
// record kind has one parser.
func decodeRecord(prefix, key string, raw []byte, deleted bool) any {
	if deleted {
		return nil
	}
	for _, k := range RecordKinds() {
		if k.Prefix != prefix {
			continue
		}
		v, err := k.Decode(key, raw)
		if err != nil {
			return err
		}
		return calcValue(v)
	}
	return nil
}

// RecordKinds are the kinds of record the syncer follows for policy,
// with their owners' decoders.
func RecordKinds() []datastore.Kind {
	var out []datastore.Kind
	for _, k := range slices.Concat(datastore.Kinds(), ipam.Kinds(), api.Kinds()) {
		if slices.Contains(followed, k.Prefix) {
			out = append(out, k)
		}
	}
	return out
}

// calcValue is the Calculator's form of a value the syncer decoded.
func calcValue(v any) any {
	switch v := v.(type) {
	case *ipam.PoolInfo:
		return v.Pool
	case *datastore.Network:
		return *v
	case *datastore.WorkloadEndpoint:
		return v.Endpoint
	case *datastore.Node:
		return *v
	case *api.GlobalNetworkPolicy:
		return *v
	case *api.HostEndpoint:
		return *v
	case *api.GlobalNetworkSet:
		return *v
	}
	return fmt.Errorf("unexpected record value %T", v)
}

// merge applies u to records; it returns the revision of the endpoint
// records it brings (0 for other prefixes) and whether a record changed.
func (s *Syncer) merge(records map[string]map[string][]byte, loaded map[string]bool, u update) (int64, bool) {
	var rev int64
	if u.event != nil {
		s.seenRev = max(s.seenRev, u.event.ModRevision)
	}
	if u.snapshots != nil {
		// The policy follower's lists stand for its events.
		s.seenRev = max(s.seenRev, u.rev)
	}
	if u.prefix == datastore.EndpointsPrefix {
		rev = u.rev
		if u.event != nil {
			rev = u.event.ModRevision
		}
	}
	if u.snapshot != nil {
		u.snapshots = map[string]map[string][]byte{u.prefix: u.snapshot}
	}
	if u.snapshots != nil {
		changed := false
		for prefix, snap := range u.snapshots {
			changed = changed || !loaded[prefix] || !maps.EqualFunc(records[prefix], snap, bytes.Equal)
			records[prefix] = snap
			loaded[prefix] = true
		}
		return rev, changed
	}
	if records[u.prefix] == nil {
		records[u.prefix] = map[string][]byte{}
	}
	old, had := records[u.prefix][u.event.Key]
	switch u.event.Type {
	case datastore.EventDelete:
		delete(records[u.prefix], u.event.Key)
		return rev, had
	default:
		records[u.prefix][u.event.Key] = u.event.Value
		return rev, !had || !bytes.Equal(old, u.event.Value)
	}
}

// state decodes the records; undecodable ones are skipped with a warning.
func (s *Syncer) state(records map[string]map[string][]byte) (State, []string) {
	st := State{Node: s.cfg.Node, IPv6: s.cfg.IPv6, Failsafe: *s.cfg.Failsafe}
	var bad []string
	for _, prefix := range followed {
		m := records[prefix]
		keys := slices.Sorted(maps.Keys(m))
		for _, k := range keys {
			switch v := decodeRecord(prefix, k, m[k], false).(type) {
			case error:
				bad = append(bad, fmt.Sprintf("ignoring unreadable record %s: %v", k, v))
			case ipam.Pool:
				st.Pools = append(st.Pools, v)
			case datastore.Network:
				st.Networks = append(st.Networks, v)
			case datastore.Endpoint:
				st.Endpoints = append(st.Endpoints, v)
			case datastore.Node:
				st.Nodes = append(st.Nodes, v)
			case api.GlobalNetworkPolicy:
				st.Policies = append(st.Policies, v)
			case api.HostEndpoint:
				st.HostEndpoints = append(st.HostEndpoints, v)
			case api.GlobalNetworkSet:
				st.NetworkSets = append(st.NetworkSets, v)
			}
		}
	}
	return st, bad
}

// unnamedNetworks are the records whose identity still is their id.
func unnamedNetworks(ns []datastore.Network) map[string]bool {
	out := map[string]bool{}
	for _, n := range ns {
		if n.Name == "" && strings.TrimSpace(n.Options[OptNetwork]) == "" {
			out[n.ID] = true
		}
	}
	return out
}

// offerNames hands the resolver the latest candidates, replacing an older
// list it has not taken yet.
func offerNames(ch chan map[string]bool, ids map[string]bool) {
	select {
	case <-ch:
	default:
	}
	select {
	case ch <- ids:
	default:
	}
}

// resolveNames asks Docker for the names of unnamed networks and records
// them in the network records, so that every host can tell which of its
// endpoints belong to the same logical network. Ids Docker does not know
// (other hosts' networks, or one whose creation is still in flight) are
// asked again with a growing delay. This runs outside any plugin request:
// asking dockerd from inside one could deadlock it.
func (s *Syncer) resolveNames(ctx context.Context, in <-chan map[string]bool) {
	pending := map[string]bool{}
	next := map[string]time.Time{}
	delay := map[string]*retry.Backoff{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Work on what is due, then sleep until the next one is.
		now := time.Now()
		wake := now.Add(time.Hour)
		for _, id := range sortedKeys(pending) {
			if ctx.Err() != nil {
				return
			}
			if t := next[id]; !t.IsZero() && t.After(now) {
				wake = minTime(wake, t)
				continue
			}
			done := s.resolveOne(ctx, id)
			if done {
				delete(pending, id)
				delete(next, id)
				delete(delay, id)
				continue
			}
			if delay[id] == nil {
				delay[id] = retry.New(retry.Policy{Initial: nameRetryMin, Max: nameRetryMax})
			}
			next[id] = time.Now().Add(delay[id].Next())
			wake = minTime(wake, next[id])
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			return
		case ids := <-in:
			for id := range pending {
				if !ids[id] {
					delete(pending, id)
					delete(next, id)
					delete(delay, id)
				}
			}
			for id := range ids {
				pending[id] = true
			}
		case <-timer.C:
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// resolveOne names one network; true when nothing more is to be done.
func (s *Syncer) resolveOne(ctx context.Context, id string) bool {
	log := s.log.WithField("network", dataplane.ShortID(id))
	cctx, cancel := context.WithTimeout(ctx, nameCallTimeout)
	name, found, err := s.cfg.Names.NetworkName(cctx, id)
	cancel()
	if err != nil {
		log.WithError(err).Debug("asking Docker for the network's name")
		return false
	}
	if !found || name == "" {
		return false
	}
	key := datastore.NetworkKey(id)
	err = s.cfg.Store.Retry(ctx, func(ctx context.Context) error {
		var n datastore.Network
		rev, err := s.cfg.Store.GetJSON(ctx, key, &n)
		if errors.Is(err, datastore.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if n.Name != "" {
			return nil
		}
		n.Name = name
		return s.cfg.Store.Txn(ctx, datastore.Update(key, datastore.MustJSON(n), rev))
	})
	if err != nil {
		log.WithError(err).Warn("recording the network's name")
		return false
	}
	log.WithField("name", name).Info("recorded the Docker network's name: its endpoints on all hosts now form one network")
	return true
}
