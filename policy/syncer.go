package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/ipam"
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
// networks, endpoints and nodes with etcd watches (re-listing when a watch
// breaks) and applies the desired tables after every burst of changes.
type Syncer struct {
	cfg Config
	log logrus.FieldLogger

	// passedRev is the datastore revision of the newest event a finished
	// pass has taken in: tests wait on it before asserting what a change
	// did not cause. seenRev is the loop's running maximum.
	passedRev atomic.Int64
	seenRev   int64
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
	return &Syncer{cfg: cfg, log: cfg.Log.WithField("component", "policy")}, nil
}

var followed = []string{ipam.PoolsPrefix, datastore.NetworksPrefix, datastore.EndpointsPrefix, datastore.NodesPrefix}

// update is what a prefix follower tells the main loop: a full snapshot
// (after a (re-)list) or one event.
type update struct {
	prefix   string
	snapshot map[string][]byte // non-nil: replaces the prefix's records
	event    *datastore.Event
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
	updates := make(chan update, 256)
	for _, p := range followed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.follow(ctx, p, updates)
		}()
	}
	var names chan map[string]bool
	if s.cfg.Names != nil {
		names = make(chan map[string]bool, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.resolveNames(ctx, names)
		}()
	}

	records := map[string]map[string][]byte{}
	loaded := map[string]bool{}
	var lastApplied string
	delay := retry.New(retry.Standard())
	var retry *time.Timer
	var retryC <-chan time.Time
	ticker := time.NewTicker(s.cfg.ResyncInterval)
	defer ticker.Stop()
	warned := map[string]bool{}

	apply := func(force bool) {
		if len(loaded) < len(followed) {
			return // not everything read yet: a partial view would drop rules
		}
		st, bad := s.state(records)
		want, warnings := Desired(st)
		// Each problem is logged once while it lasts, not at every burst.
		now := map[string]bool{}
		for _, w := range append(bad, warnings...) {
			now[w] = true
			if !warned[w] {
				s.log.Warn(w)
			}
		}
		warned = now
		if names != nil {
			offerNames(names, unnamedNetworks(st.Networks))
		}
		text := want.Render()
		if !force && text == lastApplied {
			return
		}
		start := time.Now()
		n, err := s.cfg.Dataplane.Apply(ctx, want)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			next := delay.Next()
			s.log.WithError(err).WithField("retryIn", next).Error("programming the nftables policy failed")
			lastApplied = ""
			if retry == nil {
				retry = time.NewTimer(next)
				retryC = retry.C
			}
			return
		}
		delay.Reset()
		lastApplied = text
		if n > 0 {
			s.log.WithFields(logrus.Fields{"changes": n, "took": time.Since(start).Round(time.Microsecond), "localEndpoints": countLocal(st)}).Info("nftables policy updated")
		}
	}

	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case u := <-updates:
			s.merge(records, loaded, u)
		case <-retryC:
			retry, retryC = nil, nil
			force = true
		case <-ticker.C:
			force = true
		}
		// Take the whole burst before computing (a docker run of many
		// containers, a re-list).
		for drained := false; !drained; {
			select {
			case u := <-updates:
				s.merge(records, loaded, u)
			default:
				drained = true
			}
		}
		apply(force)
		s.passedRev.Store(s.seenRev)
	}
}

func (s *Syncer) merge(records map[string]map[string][]byte, loaded map[string]bool, u update) {
	if u.event != nil {
		s.seenRev = max(s.seenRev, u.event.ModRevision)
	}
	if u.snapshot != nil {
		records[u.prefix] = u.snapshot
		loaded[u.prefix] = true
		return
	}
	if records[u.prefix] == nil {
		records[u.prefix] = map[string][]byte{}
	}
	switch u.event.Type {
	case datastore.EventDelete:
		delete(records[u.prefix], u.event.Key)
	default:
		records[u.prefix][u.event.Key] = u.event.Value
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
		case out <- update{prefix: prefix, snapshot: snap}:
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

// state decodes the records; undecodable ones are skipped with a warning.
func (s *Syncer) state(records map[string]map[string][]byte) (State, []string) {
	st := State{Node: s.cfg.Node, IPv6: s.cfg.IPv6}
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
	decode(datastore.EndpointsPrefix, func(k string, v []byte) error {
		var e datastore.Endpoint
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		// The key is the truth about which node the endpoint is on.
		node, id, ok := datastore.EndpointNodeAndID(k)
		if !ok {
			return errors.New("not an endpoints/<node>/<id> key")
		}
		e.Node = node
		if e.ID == "" {
			e.ID = id
		}
		st.Endpoints = append(st.Endpoints, e)
		return nil
	})
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

func countLocal(st State) int {
	n := 0
	for _, e := range st.Endpoints {
		if e.Node == st.Node && e.Joined {
			n++
		}
	}
	return n
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
	log := s.log.WithField("network", shortID(id))
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
