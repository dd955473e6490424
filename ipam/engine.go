// Package ipam is calico-cnm's address manager, with Calico's semantics: IP
// pools cut into fixed-size blocks (/26, /122), each block affine to one host
// so that the host can route the whole block, handles that tie addresses to
// their owner, borrowing from other hosts' blocks when the pool has no free
// block left (unless strictAffinity).
//
// Every mutation is one guarded etcd transaction; in particular an address is
// always written together with its handle. The engine keeps an in-memory copy
// of the blocks affine to the hosts it serves, with their ModRevision, and
// writes against that copy optimistically: an assignment on the warm path
// (the host owns a block with room) is exactly one etcd round trip, and a
// stale copy costs a conflict and a re-read, never a wrong write. Every
// write that uses a pool also compares the pool's revision, so disabling or
// deleting a pool stops all hosts at once even with their caches.
//
// Semantics the callers rely on:
//
//   - Block order: a host walks a pool's blocks from a start derived from a
//     hash of its name, then consecutively, wrapping (Calico's choice):
//     racing hosts rarely collide and a host's blocks tend to be adjacent.
//     Within a block, addresses go lowest first and freed ones are reused
//     last. All addresses of a block are usable (no network/broadcast).
//   - Handles: every assignment names a handle (the driver uses the
//     endpoint id); a handle may hold several addresses (dual stack). The
//     handle record counts its addresses per block and is written in the
//     same transaction as the block. Assigning a specific address again to
//     the same handle is a no-op.
//   - Release: ReleaseIP of a free address is nil; of an address outside
//     every pool, ErrNotInPool. ReleaseByHandle of an unknown handle is nil.
//     An affine block that becomes empty stays with its host for the grace
//     period (DefaultReleaseGracePeriod, 30s) and is given back by
//     ReleaseEmptyBlocks, which the daemon calls periodically; with
//     ReleaseImmediately it goes in the releasing transaction. A block
//     without affinity is deleted as soon as it is empty.
//   - Routing learns about blocks through WatchHostBlocks (confirmed
//     affinities). An address outside the host's blocks was borrowed and
//     needs its own /32 (/128) route and advertisement.
package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// DefaultReleaseGracePeriod is how long an affine block must stay empty before
// ReleaseEmptyBlocks gives it back. Long enough that a container restart (or
// a `docker run --rm` loop) does not make the host drop its block, withdraw
// the route and claim a new one; short enough that an idle host returns its
// blocks within a couple of reconcile cycles.
const DefaultReleaseGracePeriod = 30 * time.Second

// ReleaseImmediately as Options.ReleaseGracePeriod gives an affine block back
// in the very transaction that frees its last address.
const ReleaseImmediately time.Duration = -1

// maxAttempts bounds optimistic retries of one operation; conflicts resolve
// after a re-read, so reaching it means something keeps changing under us.
const maxAttempts = 20

// Options tunes an Engine; the zero value is usable.
type Options struct {
	// ReleaseGracePeriod: 0 means DefaultReleaseGracePeriod, a negative
	// value (ReleaseImmediately) releases emptied blocks at once.
	ReleaseGracePeriod time.Duration
	Log                logrus.FieldLogger
	// Now is the clock (tests move it to cross the grace period).
	Now func() time.Time
	// AssignGate, when set, may refuse AutoAssign (the daemon: while a
	// datastore restore is not reconciled, a free-looking address may be
	// a running container's). AssignIP, which reconcile uses to reclaim
	// those addresses, is not gated.
	AssignGate func(ctx context.Context) error
	// GuardedGate is AssignGate for a gate whose answer the assignment's
	// own transaction checks (datastore.RestoreGate), so that it need not
	// read the datastore for every assignment. It replaces AssignGate.
	GuardedGate Gate
	// Records, when set, is the daemon's datastore syncer, which
	// WatchHostBlocks follows.
	Records datastore.Records
}

// Gate admits or refuses AutoAssign. Admit's ops ride in every
// transaction that assigns the address, so its answer still holds when
// the assignment commits; after such a transaction failed a compare,
// Forget makes the next Admit decide afresh.
type Gate interface {
	Admit(ctx context.Context) ([]datastore.Op, error)
	Forget()
}

// funcGate is a Gate that decides by a call (Options.AssignGate), with no
// check in the transaction.
type funcGate func(ctx context.Context) error

func (f funcGate) Admit(ctx context.Context) ([]datastore.Op, error) { return nil, f(ctx) }
func (funcGate) Forget()                                             {}

// Config is the cluster-wide IPAM configuration (record ipam/config).
// SetConfig writes all fields: read, modify, write.
type Config struct {
	StrictAffinity     bool `json:"strictAffinity"`
	AutoAllocateBlocks bool `json:"autoAllocateBlocks"`
	MaxBlocksPerHost   int  `json:"maxBlocksPerHost"` // 0: unlimited
}

// DefaultConfig is what GetConfig returns before anyone set a config.
func DefaultConfig() Config { return Config{AutoAllocateBlocks: true} }

// Engine is the IPAM implementation. It is safe for concurrent use; one
// Engine per process (it may serve several hosts, e.g. in tests).
type Engine struct {
	store *datastore.Store
	log   logrus.FieldLogger
	now   func() time.Time
	grace time.Duration
	gate  Gate // nil: no gate
	// records is the datastore syncer WatchHostBlocks follows (nil: a
	// syncer of its own).
	records datastore.Records

	mu     sync.Mutex
	hosts  map[string]*hostState
	pools  []poolEntry // nil: not loaded
	blocks map[netip.Prefix]cachedBlock
	// affine indexes blocks by affinity, each list lowest address first:
	// the warm path looks at one host's blocks only, in order, without
	// sorting or copying them (see firstAffine).
	affine  map[string][]netip.Prefix
	handles map[string]cachedHandle
	// abandoned are handles of assignments answered as failed that may
	// have landed (ReleaseAbandoned).
	abandoned map[string]bool
	// intents are ExpectRelease's expected holders, by address.
	intents map[netip.Addr]releaseIntent
	// config is the IPAM configuration as a claim last read it (nil: read
	// it); see claimConfig.
	config *cachedConfig
	// cacheResets is the store's RevisionResets that blocks were read
	// under (syncResets).
	cacheResets int64

	// lostClaims counts block claims lost to another host (tests, logs).
	lostClaims atomic.Int64
}

// hostState serialises the assignments of one host inside this process:
// they would otherwise race for the same free ordinal of the same cached
// block and turn every parallel request into an etcd conflict.
type hostState struct {
	sem    chan struct{}
	loaded bool // affine blocks read from etcd at least once
}

type cachedBlock struct {
	b   *block
	rev int64
}

type cachedHandle struct {
	rec handleRecord
	rev int64
}

// maxCachedHandles bounds the handle cache; entries normally leave when the
// handle is released, this only guards against handles released elsewhere.
const maxCachedHandles = 8192

// New returns an Engine on store.
func New(store *datastore.Store, opts Options) *Engine {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ReleaseGracePeriod == 0 {
		opts.ReleaseGracePeriod = DefaultReleaseGracePeriod
	}
	var gate Gate
	switch {
	case opts.GuardedGate != nil:
		gate = opts.GuardedGate
	case opts.AssignGate != nil:
		gate = funcGate(opts.AssignGate)
	}
	return &Engine{
		gate:    gate,
		store:   store,
		log:     opts.Log.WithField("component", "ipam"),
		now:     opts.Now,
		grace:   opts.ReleaseGracePeriod,
		records: opts.Records,
		hosts:   map[string]*hostState{},
		blocks:  map[netip.Prefix]cachedBlock{},
		affine:  map[string][]netip.Prefix{},
		handles: map[string]cachedHandle{},
	}
}

func validHost(host string) error {
	if host == "" || strings.ContainsAny(host, "/ \t\n") {
		return newError(ErrInvalidArgument, "invalid host name %q: it must be non-empty and contain no '/' or spaces", host)
	}
	return nil
}

func validHandle(id string) error {
	if id == "" || strings.ContainsAny(id, "\n\r") {
		return newError(ErrInvalidArgument, "invalid handle id %q: every assignment needs a handle (e.g. the endpoint id)", id)
	}
	return nil
}

func (e *Engine) host(name string) *hostState {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.hosts[name]
	if h == nil {
		h = &hostState{sem: make(chan struct{}, 1)}
		e.hosts[name] = h
	}
	return h
}

func (h *hostState) lock(ctx context.Context) error {
	select {
	case h.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hostState) unlock() { <-h.sem }

// --- block cache ---

// cacheBlock remembers b at rev if it is affine to a host this engine serves;
// older revisions never replace newer ones.
func (e *Engine) cacheBlock(b *block, rev int64) {
	e.cacheOwnedBlock(b.clone(), rev)
}

// cacheOwnedBlock is cacheBlock of a block nobody else holds or changes
// any more (the private copy an assignment just wrote): it is kept as it
// is, not copied again.
func (e *Engine) cacheOwnedBlock(b *block, rev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.blocks[b.prefix]; ok && old.rev > rev {
		return
	}
	if _, served := e.hosts[b.host()]; !served || b.host() == "" {
		e.dropBlockLocked(b.prefix)
		return
	}
	e.setBlockLocked(cachedBlock{b: b, rev: rev})
}

func (e *Engine) uncacheBlock(p netip.Prefix) {
	e.mu.Lock()
	e.dropBlockLocked(p)
	e.mu.Unlock()
}

// setBlockLocked caches c, keeping the affinity index in step. e.mu held.
func (e *Engine) setBlockLocked(c cachedBlock) {
	p := c.b.prefix
	if old, ok := e.blocks[p]; ok && old.b.Affinity != c.b.Affinity {
		e.dropBlockLocked(p)
	}
	if _, ok := e.blocks[p]; !ok {
		list := e.affine[c.b.Affinity]
		i, _ := slices.BinarySearchFunc(list, p, comparePrefix)
		e.affine[c.b.Affinity] = slices.Insert(list, i, p)
	}
	e.blocks[p] = c
}

// dropBlockLocked forgets block p and its place in the affinity index.
// e.mu held.
func (e *Engine) dropBlockLocked(p netip.Prefix) {
	old, ok := e.blocks[p]
	if !ok {
		return
	}
	delete(e.blocks, p)
	list := e.affine[old.b.Affinity]
	if i, found := slices.BinarySearchFunc(list, p, comparePrefix); found {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(e.affine, old.b.Affinity)
	} else {
		e.affine[old.b.Affinity] = list
	}
}

func (e *Engine) cachedBlock(p netip.Prefix) (*block, int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.blocks[p]
	if !ok {
		return nil, 0, false
	}
	return c.b.clone(), c.rev, true
}

// firstAffine is a private copy of the lowest cached block affine to host
// (so a host fills its first block before the next) in which pick finds an
// ordinal, and that ordinal. pick runs under e.mu, on the cached block
// itself: it must only read it. Only the chosen block is copied, so an
// assignment costs the same whether the host owns 1 block or 100.
func (e *Engine) firstAffine(host string, pick func(b *block) (int, bool)) (cachedBlock, int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.affine[affinityOf(host)] {
		c := e.blocks[p]
		if ord, ok := pick(c.b); ok {
			return cachedBlock{b: c.b.clone(), rev: c.rev}, ord, true
		}
	}
	return cachedBlock{}, 0, false
}

// readBlock gets a block from etcd and refreshes the cache; ok is false when
// it does not exist.
func (e *Engine) readBlock(ctx context.Context, p netip.Prefix) (*block, int64, bool, error) {
	kv, err := e.store.Get(ctx, blockKey(p))
	if errors.Is(err, datastore.ErrNotFound) {
		e.uncacheBlock(p)
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	b, err := decodeBlock(kv.Key, kv.Value)
	if err != nil {
		return nil, 0, false, err
	}
	e.cacheBlock(b, kv.ModRevision)
	return b, kv.ModRevision, true, nil
}

// loadBlock reads block p from etcd when fresh (after a conflict, or when
// the cache may predate another writer), else takes the cached copy.
func (e *Engine) loadBlock(ctx context.Context, p netip.Prefix, fresh bool) (*block, int64, bool, error) {
	if fresh {
		return e.readBlock(ctx, p)
	}
	return e.blockFor(ctx, p)
}

// blockFor returns the cached block when there is one, else reads it.
func (e *Engine) blockFor(ctx context.Context, p netip.Prefix) (*block, int64, bool, error) {
	if b, rev, ok := e.cachedBlock(p); ok {
		return b, rev, true, nil
	}
	return e.readBlock(ctx, p)
}

// --- handle cache ---

// handleState is a handle as the next transaction will compare it: rev 0
// means "must not exist yet".
type handleState struct {
	id  string
	rec handleRecord
	rev int64
}

// op is the transaction step that stores h: create, update, or delete when
// the handle holds nothing any more.
func (h handleState) op() (datastore.Op, bool) {
	if h.rec.total() == 0 {
		if h.rev == 0 {
			return datastore.Op{}, false
		}
		return datastore.Delete(handleKey(h.id), h.rev), true
	}
	return datastore.Write(handleKey(h.id), datastore.MustJSON(h.rec), h.rev), true
}

// handleOptimistic is the cached handle, or a guess that it does not exist
// yet (the normal case for a new endpoint): a wrong guess costs a conflict.
func (e *Engine) handleOptimistic(id string) handleState {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.handles[id]; ok {
		return handleState{id: id, rec: c.rec.clone(), rev: c.rev}
	}
	return handleState{id: id, rec: handleRecord{Blocks: map[string]int{}}}
}

// handleCachedOrRead is the cached handle or the one in etcd.
func (e *Engine) handleCachedOrRead(ctx context.Context, id string) (handleState, error) {
	e.mu.Lock()
	c, ok := e.handles[id]
	e.mu.Unlock()
	if ok {
		return handleState{id: id, rec: c.rec.clone(), rev: c.rev}, nil
	}
	return e.readHandle(ctx, id)
}

func (e *Engine) readHandle(ctx context.Context, id string) (handleState, error) {
	var rec handleRecord
	rev, err := e.store.GetJSON(ctx, handleKey(id), &rec)
	if errors.Is(err, datastore.ErrNotFound) {
		e.uncacheHandle(id)
		return handleState{id: id, rec: handleRecord{Blocks: map[string]int{}}}, nil
	}
	if err != nil {
		return handleState{}, err
	}
	if rec.Blocks == nil {
		rec.Blocks = map[string]int{}
	}
	e.cacheHandle(handleState{id: id, rec: rec, rev: rev})
	return handleState{id: id, rec: rec.clone(), rev: rev}, nil
}

func (e *Engine) cacheHandle(h handleState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if h.rec.total() == 0 || h.rev == 0 {
		delete(e.handles, h.id)
		return
	}
	if old, ok := e.handles[h.id]; ok && old.rev > h.rev {
		return
	}
	if len(e.handles) >= maxCachedHandles {
		clear(e.handles)
	}
	e.handles[h.id] = cachedHandle{rec: h.rec.clone(), rev: h.rev}
}

func (e *Engine) uncacheHandle(id string) {
	e.mu.Lock()
	delete(e.handles, id)
	e.mu.Unlock()
}

// --- config ---

// GetConfig returns the IPAM configuration, DefaultConfig when none was set.
func (e *Engine) GetConfig(ctx context.Context) (Config, error) {
	c, _, err := e.readConfig(ctx)
	return c, err
}

// readConfig is GetConfig with the revision of the record (0: none).
func (e *Engine) readConfig(ctx context.Context) (Config, int64, error) {
	c := DefaultConfig()
	rev, err := e.store.GetJSON(ctx, configKey, &c)
	if errors.Is(err, datastore.ErrNotFound) {
		return DefaultConfig(), 0, nil
	}
	if err != nil {
		return Config{}, 0, fmt.Errorf("reading IPAM config: %w", err)
	}
	return c, rev, nil
}

// cachedConfig is the configuration at a revision (0: no record).
type cachedConfig struct {
	c   Config
	rev int64
}

// claimConfig is the configuration a block claim decides on: the cached
// copy unless fresh is asked for. A cached copy may be stale, so a claim it
// allows carries guard, which fails the claim's transaction if the record
// changed since (then the cache is dropped and the claim retried); cached
// says the copy came from the cache, so that a claim it forbids is decided
// again on a fresh read. A cold claim thereby saves a round trip, which
// counts when many hosts claim at the same moment.
func (e *Engine) claimConfig(ctx context.Context, fresh bool) (c Config, guard datastore.Op, cached bool, err error) {
	e.mu.Lock()
	cc := e.config
	e.mu.Unlock()
	if cc == nil || fresh {
		cfg, rev, err := e.readConfig(ctx)
		if err != nil {
			return Config{}, datastore.Op{}, false, err
		}
		cc = &cachedConfig{c: cfg, rev: rev}
		e.mu.Lock()
		e.config = cc
		e.mu.Unlock()
	} else {
		cached = true
	}
	return cc.c, datastore.Check(configKey, cc.rev), cached, nil
}

// invalidateConfig makes the next claim read the configuration.
func (e *Engine) invalidateConfig() {
	e.mu.Lock()
	e.config = nil
	e.mu.Unlock()
}

// SetConfig replaces the IPAM configuration. All fields are written, so
// callers changing one setting should GetConfig first.
func (e *Engine) SetConfig(ctx context.Context, c Config) error {
	if c.MaxBlocksPerHost < 0 {
		return newError(ErrInvalidArgument, "maxBlocksPerHost must be 0 (unlimited) or positive, not %d", c.MaxBlocksPerHost)
	}
	err := e.store.Retry(ctx, func(ctx context.Context) error {
		var old json.RawMessage
		rev, err := e.store.GetJSON(ctx, configKey, &old)
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		return e.store.Txn(ctx, datastore.Write(configKey, datastore.MustJSON(c), rev))
	})
	e.invalidateConfig()
	return err
}
