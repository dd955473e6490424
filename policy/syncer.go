package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
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
	Store     *datastore.Store
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

	// policies caches decoded policy records by key (strict decoding is
	// slow and runs at every pass); only the Run loop uses it.
	policies decodeCache[api.GlobalNetworkPolicy]
	// endpoints caches decoded endpoint records by key: a pass decodes
	// only the records that changed, not every endpoint of the cluster.
	endpoints decodeCache[datastore.Endpoint]
	// hostEndpoints and networkSets likewise (a network set may hold
	// thousands of networks).
	hostEndpoints decodeCache[api.HostEndpoint]
	networkSets   decodeCache[api.GlobalNetworkSet]

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
	for {
		s.mu.Lock()
		done, ch, why := s.programmed >= rev, s.advanced, s.unhealthy
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if why == "" {
				why = "still applying"
			}
			return fmt.Errorf("%w: the endpoint's rules are not in the kernel (%s): %w", ErrNotProgrammed, why, ctx.Err())
		}
	}
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
// running containers.
func (s *Syncer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	// Returning waits for the helpers: nothing of the syncer uses the
	// datastore or Docker after Run.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	updates, names := s.startHelpers(ctx, &wg)
	ss := &syncState{
		records: map[string]map[string][]byte{},
		loaded:  map[string]bool{},
		delay:   retry.New(retry.Standard()),
		warned:  map[string]bool{},
		names:   names,
	}
	ticker := time.NewTicker(s.cfg.ResyncInterval)
	defer ticker.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case u := <-updates:
			ss.merge(s, u)
		case <-ss.retryC:
			ss.retryTimer, ss.retryC = nil, nil
			force = true
		case <-ticker.C:
			force = true
		}
		// Take the whole burst before computing (a docker run of many
		// containers, a re-list).
		for drained := false; !drained; {
			select {
			case u := <-updates:
				ss.merge(s, u)
			default:
				drained = true
			}
		}
		s.apply(ctx, ss, force)
		s.passedRev.Store(s.seenRev)
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

// startHelpers starts a follower per prefix and, given a NameResolver,
// the name resolver (names is nil otherwise); wg counts them.
func (s *Syncer) startHelpers(ctx context.Context, wg *sync.WaitGroup) (updates chan update, names chan map[string]bool) {
	updates = make(chan update, 256)
	for _, p := range followed {
		if slices.Contains(policyKinds, p) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.follow(ctx, p, updates)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.followPolicy(ctx, updates)
	}()
	if s.cfg.Names != nil {
		names = make(chan map[string]bool, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.resolveNames(ctx, names)
		}()
	}
	return updates, names
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
// a deletion.
func decodeRecord(prefix, key string, raw []byte, deleted bool) any {
	if deleted {
		return nil
	}
	var (
		v   any
		err error
	)
	switch prefix {
	case ipam.PoolsPrefix:
		var p ipam.Pool
		err = json.Unmarshal(raw, &p)
		v = p
	case datastore.NetworksPrefix:
		var n datastore.Network
		err = json.Unmarshal(raw, &n)
		if n.ID == "" {
			n.ID = strings.TrimPrefix(key, datastore.NetworksPrefix)
		}
		v = n
	case datastore.EndpointsPrefix:
		v, err = decodeEndpointRecord(key, raw)
	case datastore.NodesPrefix:
		var n datastore.Node
		err = json.Unmarshal(raw, &n)
		v = n
	case api.PoliciesPrefix:
		v, err = decodePolicyRecord(key, raw)
	case api.HostEndpointsPrefix:
		v, err = api.DecodeHostEndpointRecord(key, raw)
	case api.NetworkSetsPrefix:
		v, err = api.DecodeNetworkSetRecord(key, raw)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	return v
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

// follow lists a prefix and watches it from the list's revision; when the
// watch breaks it lists again (with backoff), so the main loop always ends
// up with the current records.
func (s *Syncer) follow(ctx context.Context, prefix string, out chan<- update) {
	delay := retry.New(retry.Standard())
	for ctx.Err() == nil {
		kvs, rev, err := s.cfg.Store.ListWithRevision(ctx, prefix)
		if err != nil {
			if ctx.Err() == nil {
				s.log.WithError(err).WithField("prefix", prefix).Warn("reading the datastore; retrying")
			}
			if !delay.Wait(ctx) {
				return
			}
			continue
		}
		snap := make(map[string][]byte, len(kvs))
		for _, kv := range kvs {
			snap[kv.Key] = kv.Value
		}
		select {
		case out <- update{prefix: prefix, snapshot: snap, rev: rev}:
		case <-ctx.Done():
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		for ev := range s.cfg.Store.Watch(wctx, prefix, rev) {
			if ev.Err != nil {
				if ctx.Err() == nil {
					s.log.WithError(ev.Err).WithField("prefix", prefix).Warn("datastore watch broke; re-reading")
				}
				break
			}
			delay.Reset()
			e := ev
			select {
			case out <- update{prefix: prefix, event: &e}:
			case <-ctx.Done():
			}
		}
		cancel()
		if !delay.Wait(ctx) {
			return
		}
	}
}

// followPolicy follows the policy kinds (policyKinds) as one: a list of
// api.Prefix, then at each watch event a new list, at one revision, that
// replaces all their records at once; the events the list already holds
// are skipped. A broken watch or list starts over (with backoff).
func (s *Syncer) followPolicy(ctx context.Context, out chan<- update) {
	delay := retry.New(retry.Standard())
	// list sends the records; cause is the revision of the event that
	// called for it (0 for the first), which the pass is then known to
	// have taken in (passedRev).
	list := func(cause int64) (int64, bool) {
		kvs, rev, err := s.cfg.Store.ListWithRevision(ctx, api.Prefix)
		if err != nil {
			if ctx.Err() == nil {
				s.log.WithError(err).WithField("prefix", api.Prefix).Warn("reading the datastore; retrying")
			}
			return 0, false
		}
		snaps := make(map[string]map[string][]byte, len(policyKinds))
		for _, p := range policyKinds {
			snaps[p] = map[string][]byte{}
		}
		for _, kv := range kvs {
			for _, p := range policyKinds {
				if strings.HasPrefix(kv.Key, p) {
					snaps[p][kv.Key] = kv.Value
				}
			}
		}
		select {
		case out <- update{snapshots: snaps, rev: cause}:
			return rev, true
		case <-ctx.Done():
			return 0, false
		}
	}
	for ctx.Err() == nil {
		rev, ok := list(0)
		if ok {
			wctx, cancel := context.WithCancel(ctx)
			for ev := range s.cfg.Store.Watch(wctx, api.Prefix, rev) {
				if ev.Err != nil {
					if ctx.Err() == nil {
						s.log.WithError(ev.Err).WithField("prefix", api.Prefix).Warn("datastore watch broke; re-reading")
					}
					break
				}
				delay.Reset()
				if ev.ModRevision <= rev {
					continue // in the last list already
				}
				if rev, ok = list(ev.ModRevision); !ok {
					break
				}
			}
			cancel()
		}
		if !delay.Wait(ctx) {
			return
		}
	}
}

// state decodes the records; undecodable ones are skipped with a warning.
func (s *Syncer) state(records map[string]map[string][]byte) (State, []string) {
	st := State{Node: s.cfg.Node, IPv6: s.cfg.IPv6, Failsafe: *s.cfg.Failsafe}
	var bad []string
	decode := func(prefix string, fn func(key string, v []byte) error) {
		m := records[prefix]
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := fn(k, m[k]); err != nil {
				bad = append(bad, fmt.Sprintf("ignoring unreadable record %s: %v", k, err))
			}
		}
	}
	decode(ipam.PoolsPrefix, func(_ string, v []byte) error {
		var p ipam.Pool
		if err := json.Unmarshal(v, &p); err != nil {
			return err
		}
		st.Pools = append(st.Pools, p)
		return nil
	})
	decode(datastore.NetworksPrefix, func(k string, v []byte) error {
		var n datastore.Network
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		if n.ID == "" {
			n.ID = strings.TrimPrefix(k, datastore.NetworksPrefix)
		}
		st.Networks = append(st.Networks, n)
		return nil
	})
	st.Endpoints = cachedRecords(&s.endpoints, records[datastore.EndpointsPrefix], decodeEndpointRecord, &bad)
	st.Policies = cachedRecords(&s.policies, records[api.PoliciesPrefix], decodePolicyRecord, &bad)
	st.HostEndpoints = cachedRecords(&s.hostEndpoints, records[api.HostEndpointsPrefix], api.DecodeHostEndpointRecord, &bad)
	st.NetworkSets = cachedRecords(&s.networkSets, records[api.NetworkSetsPrefix], api.DecodeNetworkSetRecord, &bad)
	decode(datastore.NodesPrefix, func(_ string, v []byte) error {
		var n datastore.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		st.Nodes = append(st.Nodes, n)
		return nil
	})
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

// decodeCache keeps each record's decoding by key and decodes a record
// again only when its bytes change: a pass then decodes what changed, not
// every record of the cluster. Only the Run loop uses it.
type decodeCache[T any] map[string]decoded[T]

type decoded[T any] struct {
	raw []byte
	v   T
	err error
}

// get is key's decoding of raw, by decode when raw is new or changed.
func (c *decodeCache[T]) get(key string, raw []byte, decode func(key string, raw []byte) (T, error)) (T, error) {
	if d, ok := (*c)[key]; ok && bytes.Equal(d.raw, raw) {
		return d.v, d.err
	}
	v, err := decode(key, raw)
	if *c == nil {
		*c = decodeCache[T]{}
	}
	(*c)[key] = decoded[T]{raw: raw, v: v, err: err}
	return v, err
}

// cachedRecords decodes a prefix's records through c, by key order; an
// undecodable record is left out and noted in bad. c forgets the records
// that are gone.
func cachedRecords[T any](c *decodeCache[T], m map[string][]byte, decode func(key string, raw []byte) (T, error), bad *[]string) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]T, 0, len(m))
	for _, k := range keys {
		v, err := c.get(k, m[k], decode)
		if err != nil {
			*bad = append(*bad, fmt.Sprintf("ignoring unreadable record %s: %v", k, err))
			continue
		}
		out = append(out, v)
	}
	c.keepOnly(m)
	return out
}

// keepOnly drops the records live no longer holds (deleted ones).
func (c decodeCache[T]) keepOnly(live map[string][]byte) {
	maps.DeleteFunc(c, func(k string, _ decoded[T]) bool {
		_, ok := live[k]
		return !ok
	})
}

// decodeEndpointRecord decodes an endpoint record. The key is the truth
// about which node the endpoint is on.
func decodeEndpointRecord(key string, v []byte) (datastore.Endpoint, error) {
	var ep datastore.Endpoint
	node, id, ok := datastore.EndpointNodeAndID(key)
	if err := json.Unmarshal(v, &ep); err != nil {
		return datastore.Endpoint{}, err
	}
	if !ok {
		return datastore.Endpoint{}, errors.New("not an endpoints/<node>/<id> key")
	}
	ep.Node = node
	if ep.ID == "" {
		ep.ID = id
	}
	return ep, nil
}

// decodePolicyRecord validates a policy record.
func decodePolicyRecord(key string, v []byte) (api.GlobalNetworkPolicy, error) {
	ps, errs := api.DecodeRecords([]datastore.KV{{Key: key, Value: v}})
	if len(errs) > 0 {
		return api.GlobalNetworkPolicy{}, errs[0]
	}
	return ps[0], nil
}
