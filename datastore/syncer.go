package datastore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/internal/await"
	"github.com/calico-cnm/calico-cnm/internal/retry"
)

// The syncer is the daemon's one reader of the datastore. It lists every
// kind of record the daemon follows in one transaction (one revision),
// watches the whole keyspace from the next revision, decodes each record
// once per revision and hands every subscriber the changes under the
// prefixes it asked for. A broken or compacted watch, or a datastore whose
// revision went back (restored), is handled here once: the syncer lists
// again and tells subscribers only what differs from what they were told.
// Nothing else lists the datastore to follow it; the periodic resync is
// the same list-and-diff, and finds nothing in a healthy cluster.

// Kind is one kind of record the syncer follows: the records under Prefix,
// decoded by Decode. The package that owns the record kind owns its
// decoder, so there is one parser per kind.
type Kind struct {
	Prefix string
	// Decode turns the record at key into its typed value. The value is
	// shared by every subscriber and must not be changed by them.
	Decode func(key string, value []byte) (any, error)
}

// Synced is one record as the syncer last saw it. It is immutable: a change
// makes a new Synced.
type Synced struct {
	Key         string
	ModRevision int64
	// Digest is the SHA-256 of the stored value: the syncer tells a
	// rewrite with the same content from a change by it, without keeping
	// every value's bytes next to its decoded form.
	Digest [sha256.Size]byte
	// Value is the decoded record; nil when Err is set.
	Value any
	// Err says why the record could not be decoded (a subscriber skips it,
	// as the record would have been skipped before).
	Err error
}

// Change is one change of one record: New nil means it was deleted;
// Old is what the subscriber was told before (nil: it did not exist).
type Change struct {
	Key string
	New *Synced
	Old *Synced
}

// Deleted tells whether the update removes the record.
func (u Change) Deleted() bool { return u.New == nil }

// Batch is what a subscriber takes at once: every change since its last
// batch (one Change per key, the latest), in key order.
type Batch struct {
	Changes []Change
	// Revision is the datastore revision the subscriber's view reaches
	// with this batch.
	Revision int64
	// InSync is set once the subscriber has been given every record that
	// existed at the first list: a manager may then remove kernel state no
	// record stands for.
	InSync bool
}

// SyncerConfig sets up a Syncer.
type SyncerConfig struct {
	Kinds []Kind
	// ResyncInterval is how often the syncer lists again and diffs with
	// what it holds (0: DefaultSyncerResync).
	ResyncInterval time.Duration
	Log            logrus.FieldLogger
}

// DefaultSyncerResync is the syncer's resync period when none is given.
const DefaultSyncerResync = 5 * time.Minute

// Syncer follows the datastore for every subscriber. Subscribe before or
// after Run; a late subscriber starts with the current records.
type Syncer struct {
	store  *Store
	kinds  []Kind
	resync time.Duration
	log    logrus.FieldLogger

	mu      sync.Mutex
	records map[string]*Synced
	rev     int64
	inSync  bool
	subs    []*Subscription
	// advanced is closed (and replaced) whenever rev grows.
	advanced chan struct{}
	// lists counts the lists the syncer made (tests: nothing lists at
	// idle but the resync).
	lists int64
	// stopped: Run returned; a new subscription ends at once.
	stopped bool
}

// NewSyncer makes a syncer of the given kinds over store.
func NewSyncer(store *Store, cfg SyncerConfig) (*Syncer, error) {
	if store == nil {
		return nil, errors.New("syncer needs a datastore")
	}
	if len(cfg.Kinds) == 0 {
		return nil, errors.New("syncer needs at least one kind of record")
	}
	for i, k := range cfg.Kinds {
		if k.Prefix == "" || k.Decode == nil {
			return nil, fmt.Errorf("syncer kind %d needs a prefix and a decoder", i)
		}
		for _, o := range cfg.Kinds[:i] {
			if strings.HasPrefix(k.Prefix, o.Prefix) || strings.HasPrefix(o.Prefix, k.Prefix) {
				return nil, fmt.Errorf("syncer kinds %q and %q overlap", o.Prefix, k.Prefix)
			}
		}
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = DefaultSyncerResync
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	return &Syncer{
		store: store, kinds: cfg.Kinds, resync: cfg.ResyncInterval,
		log:     cfg.Log.WithField("component", "syncer"),
		records: map[string]*Synced{}, advanced: make(chan struct{}),
	}, nil
}

// kindOf is the kind key belongs to, or nil.
func (s *Syncer) kindOf(key string) *Kind {
	for i := range s.kinds {
		if strings.HasPrefix(key, s.kinds[i].Prefix) {
			return &s.kinds[i]
		}
	}
	return nil
}

// recordOf is key's record at rev, whose stored value is raw: the one
// held when the content is the same (a copy when only its revision moved:
// a restore gives every record a new revision, and a rewrite with the same
// content is nothing for subscribers to do), else raw decoded. The value
// is hashed once.
func (s *Syncer) recordOf(k *Kind, key string, raw []byte, rev int64) *Synced {
	digest := sha256.Sum256(raw)
	old := s.current(key)
	switch {
	case old != nil && old.Digest == digest && old.ModRevision == rev:
		return old
	case old != nil && old.Digest == digest:
		same := *old
		same.ModRevision = rev
		return &same
	}
	return s.decode(k, key, raw, digest, rev)
}

func (s *Syncer) decode(k *Kind, key string, raw []byte, digest [sha256.Size]byte, rev int64) *Synced {
	r := &Synced{Key: key, ModRevision: rev, Digest: digest}
	v, err := k.Decode(key, raw)
	if err != nil {
		r.Err = fmt.Errorf("record %s: %w", key, err)
		s.log.WithError(err).WithField("key", key).Warn("ignoring a record that cannot be decoded")
	} else {
		r.Value = v
	}
	return r
}

// ErrSyncerStopped: the syncer's Run returned, so its subscriptions hear
// of no change any more.
var ErrSyncerStopped = errors.New("the datastore syncer stopped")

// Run follows the datastore until ctx ends: it returns ctx's error then,
// and never gives up before (a datastore that does not answer is retried
// with backoff). When it returns, every subscription ends with
// ErrSyncerStopped.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.stop()
	backoff := retry.New(retry.Standard())
	for ctx.Err() == nil {
		rev, err := s.list(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.WithError(err).Warn("listing the datastore failed; retrying")
			}
			if !backoff.Wait(ctx) {
				break
			}
			continue
		}
		backoff.Reset()
		err = s.watch(ctx, rev)
		if ctx.Err() != nil {
			break
		}
		switch {
		case errors.Is(err, errResyncDue):
			s.log.Debug("resync: listing the datastore again")
		case err != nil:
			s.log.WithError(err).Info("datastore watch ended; listing again")
		}
		if !errors.Is(err, errResyncDue) && !backoff.Wait(ctx) {
			break
		}
	}
	return ctx.Err()
}

// stop ends every subscription (Next returns ErrSyncerStopped).
func (s *Syncer) stop() {
	s.mu.Lock()
	s.stopped = true
	subs := slices.Clone(s.subs)
	close(s.advanced) // WaitRevision gives up
	s.advanced = make(chan struct{})
	s.mu.Unlock()
	for _, sub := range subs {
		sub.end()
	}
}

// errResyncDue ends a healthy watch at the resync period: the syncer lists
// again and diffs.
var errResyncDue = errors.New("resync due")

// list reads every kind at one revision and applies the difference with
// what the syncer holds.
func (s *Syncer) list(ctx context.Context) (int64, error) {
	ops := make([]clientv3.Op, len(s.kinds))
	for i, k := range s.kinds {
		ops[i] = clientv3.OpGet(s.store.abs(k.Prefix), clientv3.WithPrefix())
	}
	lctx, cancel := context.WithTimeout(ctx, s.store.timeout)
	defer cancel()
	s.store.reads.Add(1)
	begin := s.store.SeenRevision()
	resp, err := s.store.client.Txn(lctx).Then(ops...).Commit()
	if err != nil {
		return 0, s.store.wrap(err)
	}
	rev := resp.Header.Revision
	s.store.observe(begin, rev)

	fresh := map[string]*Synced{}
	for i, r := range resp.Responses {
		k := &s.kinds[i]
		for _, kv := range r.GetResponseRange().Kvs {
			key := s.store.rel(string(kv.Key))
			fresh[key] = s.recordOf(k, key, kv.Value, kv.ModRevision)
		}
	}
	s.mu.Lock()
	var changes []Change
	for key, r := range fresh {
		if old := s.records[key]; old == nil || old.Digest != r.Digest {
			changes = append(changes, Change{Key: key, New: r, Old: old})
		}
	}
	for key, old := range s.records {
		if fresh[key] == nil {
			changes = append(changes, Change{Key: key, Old: old})
		}
	}
	s.records = fresh
	s.lists++
	s.advanceLocked(rev, changes, true)
	s.mu.Unlock()
	return rev, nil
}

func (s *Syncer) current(key string) *Synced {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records[key]
}

// watch applies every change after rev until the watch breaks, the
// revision goes back or the resync is due.
func (s *Syncer) watch(ctx context.Context, rev int64) error {
	wctx, release := s.store.watchContext(ctx)
	defer release()
	wch := s.store.client.Watch(wctx, s.store.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	resync := time.NewTimer(s.resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-resync.C:
			return errResyncDue
		case resp, ok := <-wch:
			if !ok {
				return fmt.Errorf("%w: watch ended", ErrUnavailable)
			}
			if err := resp.Err(); err != nil {
				return s.store.wrap(err)
			}
			s.applyEvents(resp)
		}
	}
}

// applyEvents decodes the watched changes and hands them out; the batch
// reaches the response's revision even when no followed key changed.
func (s *Syncer) applyEvents(resp clientv3.WatchResponse) {
	var changes []Change
	decoded := make([]*Synced, len(resp.Events))
	for i, ev := range resp.Events {
		key := s.store.rel(string(ev.Kv.Key))
		k := s.kindOf(key)
		if k == nil || ev.Type == clientv3.EventTypeDelete {
			continue
		}
		decoded[i] = s.recordOf(k, key, ev.Kv.Value, ev.Kv.ModRevision)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ev := range resp.Events {
		key := s.store.rel(string(ev.Kv.Key))
		if s.kindOf(key) == nil {
			continue
		}
		old := s.records[key]
		if ev.Type == clientv3.EventTypeDelete {
			if old == nil {
				continue
			}
			delete(s.records, key)
			changes = append(changes, Change{Key: key, Old: old})
			continue
		}
		s.records[key] = decoded[i]
		if old != nil && old.Digest == decoded[i].Digest {
			// Rewritten unchanged: nothing for subscribers to do.
			continue
		}
		changes = append(changes, Change{Key: key, New: decoded[i], Old: old})
	}
	s.advanceLocked(resp.Header.Revision, changes, false)
}

// advanceLocked records the new revision and queues changes for every
// subscriber whose prefixes they fall under.
func (s *Syncer) advanceLocked(rev int64, changes []Change, listed bool) {
	if listed && !s.inSync {
		s.inSync = true
	}
	if rev > s.rev || listed {
		s.rev = rev
	}
	for _, sub := range s.subs {
		sub.offer(changes, s.rev, s.inSync)
	}
	close(s.advanced)
	s.advanced = make(chan struct{})
}

// Revision is the datastore revision the syncer's records reflect (0
// before the first list).
func (s *Syncer) Revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

// Lists counts the syncer's lists of the datastore.
func (s *Syncer) Lists() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// WaitRevision returns once the syncer's records reflect revision rev.
func (s *Syncer) WaitRevision(ctx context.Context, rev int64) error {
	err := await.Until(ctx, func() (bool, <-chan struct{}, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.rev >= rev {
			return true, nil, nil
		}
		if s.stopped {
			return false, nil, ErrSyncerStopped
		}
		return false, s.advanced, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for datastore revision %d: %w", rev, err)
	}
	return nil
}

// Get is the record at key as the syncer last saw it.
func (s *Syncer) Get(key string) (*Synced, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[key]
	return r, ok
}

// List is every record under prefix, in key order, with the revision they
// reflect. It reads memory only.
func (s *Syncer) List(prefix string) ([]*Synced, int64) {
	s.mu.Lock()
	out := make([]*Synced, 0, 16)
	for k, r := range s.records {
		if strings.HasPrefix(k, prefix) {
			out = append(out, r)
		}
	}
	rev := s.rev
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, rev
}

// Subscribe returns a subscription to every record under the prefixes
// (each within one of the syncer's kinds). Its first batch holds the
// records the syncer has already read; it ends with ctx.
func (s *Syncer) Subscribe(ctx context.Context, name string, prefixes ...string) *Subscription {
	sub := &Subscription{name: name, prefixes: prefixes, ready: make(chan struct{}, 1), ended: make(chan struct{}), pending: map[string]Change{}}
	s.mu.Lock()
	var initial []Change
	for k, r := range s.records {
		if sub.wants(k) {
			initial = append(initial, Change{Key: k, New: r})
		}
	}
	if s.rev > 0 {
		sub.offer(initial, s.rev, s.inSync)
	}
	s.subs = append(s.subs, sub)
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		sub.end()
	}
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		for i, o := range s.subs {
			if o == sub {
				s.subs = append(s.subs[:i], s.subs[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
	}()
	return sub
}

// Subscription is one subscriber's queue of changes. Changes to the same
// key coalesce while the subscriber is busy, so a slow subscriber takes
// the latest state, never a backlog.
type Subscription struct {
	name     string
	prefixes []string
	ready    chan struct{}
	// ended is closed when the syncer stops.
	ended   chan struct{}
	endOnce sync.Once

	mu      sync.Mutex
	pending map[string]Change
	rev     int64
	inSync  bool
	offered bool
}

func (sub *Subscription) wants(key string) bool {
	for _, p := range sub.prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// offer queues the changes the subscriber wants; the syncer holds its lock.
func (sub *Subscription) offer(changes []Change, rev int64, inSync bool) {
	sub.mu.Lock()
	for _, u := range changes {
		if !sub.wants(u.Key) {
			continue
		}
		if prev, ok := sub.pending[u.Key]; ok {
			u.Old = prev.Old
		}
		if u.Old == nil && u.New == nil {
			delete(sub.pending, u.Key)
			continue
		}
		sub.pending[u.Key] = u
	}
	// The syncer's revision only goes back when the datastore was
	// restored; the subscriber follows it there too.
	advanced := rev != sub.rev
	sub.rev = rev
	newSync := inSync && !sub.inSync
	sub.inSync = sub.inSync || inSync
	// A batch that only advances the revision still wakes the subscriber:
	// it may be waited on for a revision (a Join's own write).
	signal := len(sub.pending) > 0 || newSync || advanced || !sub.offered
	sub.offered = true
	sub.mu.Unlock()
	if signal {
		select {
		case sub.ready <- struct{}{}:
		default:
		}
	}
}

// Ready is signalled when a batch may be taken.
func (sub *Subscription) Ready() <-chan struct{} { return sub.ready }

// Take returns the pending changes (possibly none, with the revision and
// sync state reached).
func (sub *Subscription) Take() Batch {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	b := Batch{Revision: sub.rev, InSync: sub.inSync, Changes: make([]Change, 0, len(sub.pending))}
	for _, u := range sub.pending {
		b.Changes = append(b.Changes, u)
	}
	sort.Slice(b.Changes, func(i, j int) bool { return b.Changes[i].Key < b.Changes[j].Key })
	clear(sub.pending)
	return b
}

func (sub *Subscription) end() { sub.endOnce.Do(func() { close(sub.ended) }) }

// Ended is closed when the syncer stopped: no batch comes any more.
func (sub *Subscription) Ended() <-chan struct{} { return sub.ended }

// Next waits for the next batch; an error when ctx ends or the syncer
// stopped (ErrSyncerStopped) with nothing left to take.
func (sub *Subscription) Next(ctx context.Context) (Batch, error) {
	select {
	case <-sub.ready:
		return sub.Take(), nil
	case <-ctx.Done():
		return Batch{}, ctx.Err()
	case <-sub.ended:
		select {
		case <-sub.ready:
			return sub.Take(), nil
		default:
			return Batch{}, ErrSyncerStopped
		}
	}
}

// Records is what the syncer offers its consumers (*Syncer has it): each
// package takes this rather than the syncer, so tests may pass their own.
type Records interface {
	Subscribe(ctx context.Context, name string, prefixes ...string) *Subscription
	List(prefix string) ([]*Synced, int64)
	Get(key string) (*Synced, bool)
	WaitRevision(ctx context.Context, rev int64) error
}
