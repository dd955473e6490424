package ipam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// AutoAssignArgs asks for one address for a workload on Host.
type AutoAssignArgs struct {
	Host     string
	HandleID string
	Attrs    map[string]string
	IPv6     bool
	// Within restricts the address to this subnet (docker --subnet); nil
	// means any enabled pool of the family.
	Within *net.IPNet
}

// AssignIPArgs asks for one specific address (docker run --ip).
type AssignIPArgs struct {
	IP       net.IP
	Host     string
	HandleID string
	Attrs    map[string]string
}

type assignReq struct {
	host   string
	handle string
	attrs  map[string]string
	v6     bool
	within *netip.Prefix
	log    logrus.FieldLogger
	// admitted is the gate's answer; nil without a gate (and for
	// AssignIP, which is not gated).
	admitted *admission
}

// admission is the gate's answer for one AutoAssign: the ops its
// transactions carry, stale once one of them failed a compare.
type admission struct {
	ops   []datastore.Op
	stale bool
}

// Internal outcomes of a block claim.
var (
	// errBlockTaken: another host created the block first; try the next one.
	errBlockTaken = errors.New("block claimed by someone else")
	// errRetry: something else changed (pool, handle, a stale affinity);
	// start over from fresh reads.
	errRetry = errors.New("state changed, retry")
)

// AutoAssign hands out one address to req.Host, the way Calico does:
//
//  1. from a block already affine to the host (warm path: one transaction,
//     no reads, against the cached block);
//  2. else it claims a free block of an enabled pool for the host (block
//     and confirmed affinity in one transaction), unless
//     autoAllocateBlocks is off or the host has maxBlocksPerHost blocks;
//  3. else, unless strictAffinity, it borrows a free address from a block
//     affine to another host (or to none).
//
// The block and the handle are written in the same transaction. The address
// comes back as a /32 or /128.
func (e *Engine) AutoAssign(ctx context.Context, a AutoAssignArgs) (net.IPNet, error) {
	if err := validHost(a.Host); err != nil {
		return net.IPNet{}, err
	}
	if err := validHandle(a.HandleID); err != nil {
		return net.IPNet{}, err
	}
	req := assignReq{host: a.Host, handle: a.HandleID, attrs: a.Attrs, v6: a.IPv6}
	if a.Within != nil {
		w, err := prefixFromIPNet(a.Within)
		if err != nil {
			return net.IPNet{}, err
		}
		if w.Addr().Is6() != a.IPv6 {
			return net.IPNet{}, newError(ErrInvalidArgument, "subnet %s does not match the requested address family (IPv6=%v)", w, a.IPv6)
		}
		req.within = &w
	}
	req.log = e.log.WithFields(logrus.Fields{"host": req.host, "handle": req.handle})
	if e.gate != nil {
		ops, err := e.gate.Admit(ctx)
		if err != nil {
			return net.IPNet{}, fmt.Errorf("no address assigned: %w", err)
		}
		req.admitted = &admission{ops: ops}
	}
	hs := e.host(a.Host)
	if err := hs.lock(ctx); err != nil {
		return net.IPNet{}, err
	}
	defer hs.unlock()
	e.syncResets()
	addr, err := e.autoAssign(ctx, req, hs)
	if err != nil {
		return net.IPNet{}, err
	}
	return hostNet(addr), nil
}

func (e *Engine) autoAssign(ctx context.Context, req assignReq, hs *hostState) (netip.Addr, error) {
	var all map[netip.Prefix]listedBlock
	if !hs.loaded {
		var err error
		if all, err = e.reloadHost(ctx, req.host); err != nil {
			return netip.Addr{}, err
		}
		hs.loaded = true
	}
	if addr, ok, err := e.assignFromAffine(ctx, req); ok || err != nil {
		return addr, err
	}
	for round := 0; round < maxAttempts; round++ {
		// Cold path. Our copy may be stale (addresses freed by another
		// process, pools added): read everything once before claiming.
		if all == nil {
			e.invalidatePools()
			var err error
			if all, err = e.reloadHost(ctx, req.host); err != nil {
				return netip.Addr{}, err
			}
			if addr, ok, err := e.assignFromAffine(ctx, req); ok || err != nil {
				return addr, err
			}
		}
		addr, err := e.claimOrBorrow(ctx, req, all)
		if !errors.Is(err, errRetry) {
			return addr, err
		}
		all = nil
	}
	return netip.Addr{}, fmt.Errorf("assigning an address for host %s: gave up after %d rounds of concurrent changes, try again", req.host, maxAttempts)
}

// resolvePools returns the pools req may use, creating the default IPv4 pool
// when there is no IPv4 pool at all ("created on first use").
func (e *Engine) resolvePools(ctx context.Context, req assignReq) ([]poolEntry, error) {
	ps, err := e.cachedPools(ctx)
	if err != nil {
		return nil, err
	}
	usable, err := usablePools(ps, req.v6, req.within)
	if err != nil {
		// A cached "no pool" or "disabled" may be stale: only etcd may say no.
		if ps, err = e.loadPools(ctx); err != nil {
			return nil, err
		}
		usable, err = usablePools(ps, req.v6, req.within)
	}
	if err == nil || req.v6 || req.within != nil || !errors.Is(err, ErrPoolNotFound) {
		return usable, err
	}
	if _, err := e.EnsureDefaultPool(ctx); err != nil {
		return nil, err
	}
	if ps, err = e.loadPools(ctx); err != nil {
		return nil, err
	}
	return usablePools(ps, req.v6, req.within)
}

func poolOfBlock(pools []poolEntry, p netip.Prefix) (poolEntry, bool) {
	for _, x := range pools {
		if x.prefix.Contains(p.Addr()) {
			return x, true
		}
	}
	return poolEntry{}, false
}

// assignFromAffine is the warm path: take the next free address of the
// lowest cached affine block and write it. ok is false when no affine block
// has room.
func (e *Engine) assignFromAffine(ctx context.Context, req assignReq) (netip.Addr, bool, error) {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		pools, err := e.resolvePools(ctx, req)
		if err != nil {
			return netip.Addr{}, false, err
		}
		var pool poolEntry
		chosen, ord, found := e.firstAffine(req.host, func(b *block) (int, bool) {
			if b.prefix.Addr().Is6() != req.v6 || (req.within != nil && !req.within.Overlaps(b.prefix)) {
				return 0, false
			}
			p, ok := poolOfBlock(pools, b.prefix)
			if !ok {
				return 0, false // its pool is disabled or gone
			}
			pool = p
			return b.freeOrdinal(req.within)
		})
		if !found {
			return netip.Addr{}, false, nil
		}
		addr, _, err := e.commitAssign(ctx, req, chosen.b, chosen.rev, ord, pool)
		if err == nil {
			return addr, true, nil
		}
		if !errors.Is(err, datastore.ErrConflict) {
			return netip.Addr{}, false, err
		}
		// The block, the handle or the pool changed under us: read the
		// three again and retry.
		req.log.WithField("block", chosen.b.CIDR).Debug("assignment conflicted, re-reading")
		if err := e.refreshAfterConflict(ctx, req.handle, chosen.b.prefix); err != nil {
			return netip.Addr{}, false, err
		}
	}
	return netip.Addr{}, false, fmt.Errorf("assigning from the blocks of host %s: still conflicting after %d attempts: %w", req.host, maxAttempts, datastore.ErrConflict)
}

func (e *Engine) refreshAfterConflict(ctx context.Context, handleID string, blk netip.Prefix) error {
	e.invalidatePools()
	// Drop our copies first, so that the fresh read replaces them even
	// at a lower revision: a datastore wiped and restored from a backup
	// counts its revisions from the start again, and a cache that only
	// moved forward would conflict for ever.
	e.uncacheBlock(blk)
	e.uncacheHandle(handleID)
	if _, _, _, err := e.readBlock(ctx, blk); err != nil {
		return err
	}
	_, err := e.readHandle(ctx, handleID)
	return err
}

// commitAssign gives ordinal ord of b (a private copy, at revision rev; 0:
// b is new) to the request, in one transaction with the handle update and a
// check that the pool is unchanged (not disabled or deleted meanwhile).
// extra ops ride along (a claim's affinity). It returns the revision the
// transaction committed at.
func (e *Engine) commitAssign(ctx context.Context, req assignReq, b *block, rev int64, ord int, pool poolEntry, extra ...datastore.Op) (netip.Addr, int64, error) {
	guard, err := e.guard(ctx, req)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	b.allocate(ord, req.handle, req.attrs)
	h := e.handleOptimistic(req.handle)
	h.rec.add(b.prefix, 1)
	h.rec.Assigned = e.stamp()
	ops := make([]datastore.Op, 0, 3+len(extra)+len(guard))
	ops = append(ops, datastore.Write(blockKey(b.prefix), b.value(), rev))
	if op, ok := h.op(); ok {
		ops = append(ops, op)
	}
	ops = append(ops, datastore.Check(poolKey(pool.prefix), pool.rev))
	ops = append(ops, extra...)
	ops = append(ops, guard...)
	newRev, err := e.store.TxnRev(ctx, ops...)
	if isAmbiguous(err) {
		return e.settleAmbiguous(ctx, req, b.prefix, ord, err)
	}
	if len(guard) > 0 && errors.Is(err, datastore.ErrConflict) {
		// Perhaps the gate's check failed: its answer is decided again
		// before the retry commits.
		e.gate.Forget()
		req.admitted.stale = true
	}
	if err != nil {
		return netip.Addr{}, 0, err
	}
	// b is the caller's private copy, which nobody changes after a
	// successful write (every caller returns): the cache takes it.
	e.cacheOwnedBlock(b, newRev)
	h.rev = newRev
	e.cacheHandle(h)
	addr := nthAddr(b.prefix, ord)
	req.log.WithFields(logrus.Fields{"ip": addr.String(), "block": b.CIDR}).Debug("address assigned")
	return addr, newRev, nil
}

// guard is the gate's ops for req's next transaction, asking the gate
// again after one of them failed a compare.
func (e *Engine) guard(ctx context.Context, req assignReq) ([]datastore.Op, error) {
	a := req.admitted
	if a == nil {
		return nil, nil
	}
	if a.stale {
		ops, err := e.gate.Admit(ctx)
		if err != nil {
			return nil, fmt.Errorf("no address assigned: %w", err)
		}
		a.ops, a.stale = ops, false
	}
	return a.ops, nil
}

// stamp is the AttrAssigned value of an assignment committed now: every
// assignment carries its age (in its handle record), which the leak checks
// need.
func (e *Engine) stamp() string {
	return e.now().UTC().Format(time.RFC3339Nano)
}

// claimOrBorrow runs steps 2 and 3 of AutoAssign on a fresh view of all
// blocks.
func (e *Engine) claimOrBorrow(ctx context.Context, req assignReq, all map[netip.Prefix]listedBlock) (netip.Addr, error) {
	cfg, guard, cached, err := e.claimConfig(ctx, false)
	if err != nil {
		return netip.Addr{}, err
	}
	pools, err := e.resolvePools(ctx, req)
	if err != nil {
		return netip.Addr{}, err
	}
	owned := ownedInPools(all, req.host, pools)
	if cached && !claimAllowed(cfg, owned) {
		// Only a fresh read may forbid the claim (see claimConfig).
		if cfg, guard, cached, err = e.claimConfig(ctx, true); err != nil {
			return netip.Addr{}, err
		}
	}
	why := ""
	switch {
	case !cfg.AutoAllocateBlocks:
		why = "this host has no block with a free address and autoAllocateBlocks is off (`calico-cnm ipam configure --auto-allocate-blocks=true` turns it on)"
	case atBlockLimit(cfg, owned):
		// As in Calico, reaching the limit is an error, not a reason to
		// borrow: the limit exists to bound what a host routes.
		return netip.Addr{}, newError2(ErrMaxBlocks, ErrExhausted,
			"no free address in %s for host %s: it already owns %d block(s) there, the maxBlocksPerHost limit, and they are full; raise the limit (`calico-cnm ipam configure --max-blocks-per-host N`) or release addresses on this host",
			describePools(pools, req.within), req.host, owned)
	default:
		addr, err := e.claimNewBlock(ctx, req, pools, all, guard)
		if err == nil || !errors.Is(err, errNoFreeBlock) {
			return addr, err
		}
		why = allClaimed(pools, req.within, owned)
	}
	if cached {
		// Borrowing is decided on a fresh read too (strictAffinity).
		if cfg, _, _, err = e.claimConfig(ctx, true); err != nil {
			return netip.Addr{}, err
		}
	}
	if cfg.StrictAffinity {
		return netip.Addr{}, newError(ErrExhausted,
			"no free address in %s for host %s: %s, and strictAffinity forbids borrowing from other hosts' blocks; add a pool, release addresses, or turn strictAffinity off (`calico-cnm ipam configure --strict-affinity=false`)",
			describePools(pools, req.within), req.host, why)
	}
	return e.borrow(ctx, req, pools, all, why)
}

// claimAllowed: cfg lets a host owning owned blocks of the requested pools
// claim another.
func claimAllowed(cfg Config, owned int) bool {
	return cfg.AutoAllocateBlocks && !atBlockLimit(cfg, owned)
}

// atBlockLimit: owned blocks reach cfg's maxBlocksPerHost (0: no limit).
func atBlockLimit(cfg Config, owned int) bool {
	return cfg.MaxBlocksPerHost > 0 && owned >= cfg.MaxBlocksPerHost
}

// ownedInPools counts host's blocks in the pools a request draws from: as
// in Calico, maxBlocksPerHost bounds a host's blocks per requested pool
// set, so blocks of one network's pool do not starve another network.
func ownedInPools(all map[netip.Prefix]listedBlock, host string, pools []poolEntry) int {
	n := 0
	for _, c := range all {
		if c.b == nil || c.b.host() != host {
			continue
		}
		if _, ok := poolOfBlock(pools, c.b.prefix); ok {
			n++
		}
	}
	return n
}

// describePools names the pools (and the subnet restriction) for messages.
func describePools(pools []poolEntry, within *netip.Prefix) string {
	s := "pool "
	if len(pools) > 1 {
		s = "pools "
	}
	s += poolNames(pools)
	if within != nil {
		s += " (subnet " + within.String() + ")"
	}
	return s
}

// allClaimed explains that no block is left to claim: "all 1024 blocks are
// claimed by other hosts".
func allClaimed(pools []poolEntry, within *netip.Prefix, owned int) string {
	total := new(big.Int)
	for _, p := range pools {
		n, _ := new(big.Int).SetString(blockCount(span(p, within), p.BlockSize), 10)
		total.Add(total, n)
	}
	all := "all " + total.String() + " blocks are"
	if total.IsInt64() && total.Int64() == 1 {
		all = "its only block is"
	}
	if owned == 0 {
		return all + " claimed by other hosts"
	}
	if owned == 1 {
		return all + " claimed and this host's block is full"
	}
	return fmt.Sprintf("%s claimed and this host's %d blocks are full", all, owned)
}

var errNoFreeBlock = errors.New("no unclaimed block")

// claimNewBlock walks each pool's blocks (host-hashed start, see blockWalk)
// and claims the first one that does not exist yet. Losing the race for a
// block just moves on to the next.
func (e *Engine) claimNewBlock(ctx context.Context, req assignReq, pools []poolEntry, all map[netip.Prefix]listedBlock, guard datastore.Op) (netip.Addr, error) {
	tries := 0
	for _, p := range pools {
		walk := blockWalk(span(p, req.within), p.BlockSize, req.host)
		for cand, ok := walk(); ok; cand, ok = walk() {
			if _, exists := all[cand]; exists {
				continue
			}
			if tries++; tries > maxAttempts {
				return netip.Addr{}, errRetry
			}
			addr, err := e.claimAndAssign(ctx, req, cand, p, netip.Addr{}, guard)
			if errors.Is(err, errBlockTaken) {
				all[cand] = listedBlock{}
				continue
			}
			return addr, err
		}
	}
	return netip.Addr{}, errNoFreeBlock
}

// claimAndAssign creates block cand affine to req.host with one address
// taken (specific, or the first free one) in a single transaction with the
// confirmed affinity (what routing watches for) and the handle.
// Create-if-absent on the block key is what makes a block claimed at most
// once when hosts race. One transaction, not a pending affinity confirmed
// by a second one: the block and its affinity cannot exist one without the
// other, and routing learns of the block a round trip sooner.
func (e *Engine) claimAndAssign(ctx context.Context, req assignReq, cand netip.Prefix, pool poolEntry, specific netip.Addr, guards ...datastore.Op) (netip.Addr, error) {
	b := newBlock(cand, req.host)
	var ord int
	if specific.IsValid() {
		ord, _ = ordinalOf(cand, specific)
	} else {
		o, ok := b.freeOrdinal(req.within)
		if !ok {
			return netip.Addr{}, errBlockTaken
		}
		ord = o
	}
	affKey := affinityKey(req.host, cand)
	log := req.log.WithField("block", cand.String())
	addr, _, err := e.commitAssign(ctx, req, b, 0, ord, pool,
		append(guards, datastore.Create(affKey, datastore.MustJSON(affinityRecord{State: stateConfirmed})))...)
	if err == nil {
		log.Info("claimed block for host")
		return addr, nil
	}
	if !errors.Is(err, datastore.ErrConflict) {
		return netip.Addr{}, err
	}
	// Find out which guard failed.
	if _, _, exists, err := e.readBlock(ctx, cand); err != nil {
		return netip.Addr{}, err
	} else if exists {
		e.lostClaims.Add(1)
		log.Debug("lost the race for block, trying another")
		return netip.Addr{}, errBlockTaken
	}
	if kv, err := e.store.Get(ctx, affKey); err == nil {
		// An affinity without its block: left over, remove it.
		log.Warn("removing stale affinity record without a block")
		if err := e.store.Txn(ctx, datastore.Delete(affKey, kv.ModRevision), datastore.Check(blockKey(cand), 0)); err != nil && !errors.Is(err, datastore.ErrConflict) {
			return netip.Addr{}, err
		}
	} else if !errors.Is(err, datastore.ErrNotFound) {
		return netip.Addr{}, err
	}
	// Otherwise the handle, the pool or the configuration changed.
	if _, err := e.readHandle(ctx, req.handle); err != nil {
		return netip.Addr{}, err
	}
	e.invalidatePools()
	e.invalidateConfig()
	return netip.Addr{}, errRetry
}

// borrow takes a free address from a block affine to another host (or to
// none). Routing then advertises that single address from this host.
func (e *Engine) borrow(ctx context.Context, req assignReq, pools []poolEntry, all map[netip.Prefix]listedBlock, why string) (netip.Addr, error) {
	var cands []cachedBlock
	for p, c := range all {
		if c.b == nil && c.raw == nil || c.host() == req.host || p.Addr().Is6() != req.v6 {
			continue
		}
		if req.within != nil && !req.within.Overlaps(p) {
			continue
		}
		if _, ok := poolOfBlock(pools, p); !ok {
			continue
		}
		b, err := c.decoded()
		if err != nil {
			e.log.WithError(err).Warn("ignoring unreadable block")
			continue
		}
		if _, ok := b.freeOrdinal(req.within); ok {
			cands = append(cands, cachedBlock{b: b, rev: c.rev})
		}
	}
	sortBlocks(cands)
	for _, c := range cands {
		pool, _ := poolOfBlock(pools, c.b.prefix)
		b, rev := c.b, c.rev
		for attempt := 0; attempt < 3; attempt++ {
			ord, ok := b.freeOrdinal(req.within)
			if !ok {
				break
			}
			addr, _, err := e.commitAssign(ctx, req, b.clone(), rev, ord, pool)
			if err == nil {
				req.log.WithFields(logrus.Fields{"ip": addr.String(), "block": b.CIDR, "owner": b.host()}).Info("borrowed address from another host's block")
				return addr, nil
			}
			if !errors.Is(err, datastore.ErrConflict) {
				return netip.Addr{}, err
			}
			if _, err := e.readHandle(ctx, req.handle); err != nil {
				return netip.Addr{}, err
			}
			fresh, freshRev, exists, err := e.readBlock(ctx, c.b.prefix)
			if err != nil {
				return netip.Addr{}, err
			}
			if !exists {
				break
			}
			b, rev = fresh, freshRev
		}
	}
	return netip.Addr{}, newError(ErrExhausted,
		"no free address in %s for host %s: %s, and no block has a free address left to borrow; add a pool or release addresses",
		describePools(pools, req.within), req.host, why)
}

// reloadHost reads the host's affinities and all blocks, refreshes the cache
// of the host's affine blocks and repairs what an interrupted operation may
// have left: a pending affinity whose block is ours is confirmed, a missing
// affinity record is recreated, an affinity without its block is removed.
// The block record is the source of truth for ownership; the affinity
// records are what routing watches. It returns all blocks.
func (e *Engine) reloadHost(ctx context.Context, host string) (map[netip.Prefix]listedBlock, error) {
	affs, kvs, err := e.listHostAndBlocks(ctx, host)
	if err != nil {
		return nil, err
	}
	aff := affinityOf(host)
	all := e.decodeListed(kvs, aff)
	e.mu.Lock()
	for _, p := range slices.Clone(e.affine[aff]) {
		e.dropBlockLocked(p)
	}
	e.mu.Unlock()

	type rec struct {
		state string
		rev   int64
	}
	recs := map[netip.Prefix]rec{}
	for _, kv := range affs {
		_, p, ok := parseAffinityKey(kv.Key)
		if !ok {
			continue
		}
		var r affinityRecord
		_ = json.Unmarshal(kv.Value, &r)
		recs[p] = rec{state: r.State, rev: kv.ModRevision}
	}
	for p, c := range all {
		if c.b == nil || c.b.Affinity != aff {
			continue
		}
		e.cacheBlock(c.b, c.rev)
		r, ok := recs[p]
		log := e.log.WithFields(logrus.Fields{"host": host, "block": p.String()})
		var op datastore.Op
		switch {
		case !ok:
			log.Warn("block affine to this host had no affinity record, restoring it")
			op = datastore.Create(affinityKey(host, p), datastore.MustJSON(affinityRecord{State: stateConfirmed}))
		case r.state != stateConfirmed:
			log.Info("confirming block affinity left unconfirmed")
			op = datastore.Update(affinityKey(host, p), datastore.MustJSON(affinityRecord{State: stateConfirmed}), r.rev)
		default:
			continue
		}
		if err := e.store.Txn(ctx, op, datastore.Check(blockKey(p), c.rev)); err != nil && !errors.Is(err, datastore.ErrConflict) {
			return nil, err
		}
	}
	for p, r := range recs {
		if c, ok := all[p]; ok && c.affinity == aff {
			continue
		}
		e.log.WithFields(logrus.Fields{"host": host, "block": p.String()}).Warn("removing affinity record whose block is gone or owned by another host")
		check := datastore.Check(blockKey(p), 0)
		if c, ok := all[p]; ok {
			check = datastore.Check(blockKey(p), c.rev)
		}
		if err := e.store.Txn(ctx, datastore.Delete(affinityKey(host, p), r.rev), check); err != nil && !errors.Is(err, datastore.ErrConflict) {
			return nil, err
		}
	}
	return all, nil
}

// listedBlock is a block of a full listing. The blocks affine to the
// listing host are decoded (b); another host's block is kept as its record
// (raw), with its affinity read from the record's head, and decoded only
// if the host borrows from it: a cold claim lists every block of the
// cluster, and decoding them all (a map per address) was a tenth
// of the assignments' CPU with three hosts assigning. The zero value is a
// block known to exist and nothing more (a claim lost to another host).
type listedBlock struct {
	cachedBlock
	affinity string
	key      string
	raw      []byte
}

// host is the block's host ("" when it has none, or is not known).
func (l listedBlock) host() string {
	return hostOfAffinity(l.affinity)
}

// decoded is the block, decoded from its record if it was not.
func (l listedBlock) decoded() (*block, error) {
	if l.b != nil {
		return l.b, nil
	}
	if l.raw == nil {
		return nil, fmt.Errorf("block %s: its record was not read", l.key)
	}
	return decodeBlock(l.key, l.raw)
}

// decodeListed decodes listed block records; aff is the listing host's
// affinity (see listedBlock). A cached block whose record is byte for
// byte the listed one is taken as it is: a cold claim lists every block,
// and decoding each cost more than the claim's transaction once blocks
// carried assignment stamps. The cached copy is only read here and by the
// callers of reloadHost.
func (e *Engine) decodeListed(kvs []datastore.KV, aff string) map[netip.Prefix]listedBlock {
	e.mu.Lock()
	cached := make(map[string]*block, len(e.blocks))
	for p, c := range e.blocks {
		cached[blockKey(p)] = c.b
	}
	e.mu.Unlock()
	all := make(map[netip.Prefix]listedBlock, len(kvs))
	var buf []byte
	for _, kv := range kvs {
		if c, ok := cached[kv.Key]; ok {
			var err error
			if buf, err = c.appendJSON(buf[:0]); err == nil && bytes.Equal(buf, kv.Value) {
				all[c.prefix] = listedBlock{cachedBlock: cachedBlock{b: c, rev: kv.ModRevision}, affinity: c.Affinity, key: kv.Key}
				continue
			}
		}
		if cidr, affinity, ok := peekBlockHead(kv.Value); ok && affinity != aff {
			if p, err := netip.ParsePrefix(cidr); err == nil && blockKey(p) == kv.Key {
				all[p] = listedBlock{cachedBlock: cachedBlock{rev: kv.ModRevision}, affinity: affinity, key: kv.Key, raw: kv.Value}
				continue
			}
		}
		b, err := decodeBlock(kv.Key, kv.Value)
		if err != nil {
			e.log.WithError(err).Warn("ignoring unreadable block")
			continue
		}
		all[b.prefix] = listedBlock{cachedBlock: cachedBlock{b: b, rev: kv.ModRevision}, affinity: b.Affinity, key: kv.Key}
	}
	return all
}

// listHostAndBlocks lists the host's affinities and all blocks at once: a
// cold claim waits for both, and when many hosts claim at the same moment
// etcd answers each round trip slowly.
func (e *Engine) listHostAndBlocks(ctx context.Context, host string) (affs, blocks []datastore.KV, err error) {
	lists, lctx := errgroup.WithContext(ctx)
	lists.Go(func() (err error) {
		if affs, err = e.store.List(lctx, hostAffinityPrefix(host)); err != nil {
			return fmt.Errorf("listing affinities of host %s: %w", host, err)
		}
		return nil
	})
	lists.Go(func() (err error) {
		if blocks, err = e.store.List(lctx, blocksPrefix); err != nil {
			return fmt.Errorf("listing IPAM blocks: %w", err)
		}
		return nil
	})
	err = lists.Wait()
	return affs, blocks, err
}

// syncResets drops every cached block once the store's revision went
// back (etcd wiped and restored, see datastore.Store.RevisionResets): a
// restored store reuses revisions for other contents, and a write guarded
// by a cached revision could then overwrite a block it never read.
func (e *Engine) syncResets() {
	resets := e.store.RevisionResets()
	e.mu.Lock()
	defer e.mu.Unlock()
	if resets != e.cacheResets {
		e.forgetBlocksLocked()
		e.cacheResets = resets
	}
}

// forgetBlocksLocked drops every cached block. e.mu held.
func (e *Engine) forgetBlocksLocked() {
	for p := range e.blocks {
		e.dropBlockLocked(p)
	}
}

// AssignIP assigns one specific address. It must lie in a pool (enabled)
// and be free; its block is claimed for the host when nobody has it. An
// address in another host's block is allowed (routing advertises it as a
// borrowed /32) unless strictAffinity is set. Assigning an address again to
// the handle that already holds it succeeds (Docker retries). Unlike
// AutoAssign, maxBlocksPerHost and autoAllocateBlocks do not apply: the user
// asked for this address explicitly (as in Calico).
func (e *Engine) AssignIP(ctx context.Context, a AssignIPArgs) error {
	if err := validHost(a.Host); err != nil {
		return err
	}
	if err := validHandle(a.HandleID); err != nil {
		return err
	}
	addr, ok := addrFromIP(a.IP)
	if !ok {
		return newError(ErrInvalidArgument, "no valid IP address given (%v)", a.IP)
	}
	req := assignReq{host: a.Host, handle: a.HandleID, attrs: a.Attrs, v6: addr.Is6()}
	req.log = e.log.WithFields(logrus.Fields{"host": req.host, "handle": req.handle, "ip": addr.String()})
	hs := e.host(a.Host)
	if err := hs.lock(ctx); err != nil {
		return err
	}
	defer hs.unlock()
	e.syncResets()

	fresh := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		pool, ok, err := e.poolContaining(ctx, addr)
		if err != nil {
			return err
		}
		if !ok {
			ps, _ := e.cachedPools(ctx)
			return newError(ErrNotInPool, "address %s is not in any IP pool (pools: %s): pick an address inside a pool, or add a pool that contains it", addr, poolNames(ps))
		}
		if pool.Disabled && !fresh {
			e.invalidatePools() // the cached pool may be stale
			fresh = true
			continue
		}
		if pool.Disabled {
			return newError(ErrPoolDisabled, "address %s is in pool %s, which is disabled: enable the pool or pick an address in another pool", addr, pool.CIDR)
		}
		bp := blockOf(addr, pool.BlockSize)
		b, rev, exists, err := e.loadBlock(ctx, bp, fresh)
		if err != nil {
			return err
		}
		if !exists {
			_, err := e.claimAndAssign(ctx, req, bp, pool, addr)
			if errors.Is(err, errBlockTaken) || errors.Is(err, errRetry) {
				fresh = true
				continue
			}
			return err
		}
		ord, _ := ordinalOf(bp, addr)
		if holder, taken := b.handleAt(ord); taken {
			if holder == a.HandleID {
				return nil
			}
			if !fresh {
				fresh = true // the cached copy may be stale: check etcd
				continue
			}
			return addressInUseError(addr, holder, bp, b)
		}
		if err := e.checkStrictAffinity(ctx, addr, bp, b, a.Host); err != nil {
			return err
		}
		_, _, err = e.commitAssign(ctx, req, b, rev, ord, pool)
		if err == nil {
			return nil
		}
		if !errors.Is(err, datastore.ErrConflict) {
			return err
		}
		if err := e.refreshAfterConflict(ctx, req.handle, bp); err != nil {
			return err
		}
		fresh = true
	}
	return fmt.Errorf("assigning %s: still conflicting after %d attempts: %w", addr, maxAttempts, datastore.ErrConflict)
}

// addressInUseError refuses addr, which holder holds in block b (read at
// bp).
func addressInUseError(addr netip.Addr, holder string, bp netip.Prefix, b *block) error {
	owner := b.host()
	if owner == "" {
		owner = "none"
	}
	return newError(ErrAddressInUse, "address %s is already in use (handle %s, block %s, host %s): pick another address or remove the container holding it", addr, holder, bp, owner)
}

// checkStrictAffinity refuses addr, in block b (read at bp), to host when b
// belongs to another host (or none) and strictAffinity is set; nil
// otherwise.
func (e *Engine) checkStrictAffinity(ctx context.Context, addr netip.Addr, bp netip.Prefix, b *block, host string) error {
	if b.host() == host {
		return nil
	}
	cfg, err := e.GetConfig(ctx)
	if err != nil {
		return err
	}
	if !cfg.StrictAffinity {
		return nil
	}
	owner := b.host()
	if owner == "" {
		owner = "no host"
	}
	return newError(ErrStrictAffinity, "address %s is in block %s, which belongs to %s, and strictAffinity forbids using another host's block: pick an address in a block of host %s or turn strictAffinity off (`calico-cnm ipam configure --strict-affinity=false`)", addr, bp, owner, host)
}
