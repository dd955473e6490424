package ipam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// releaseOps is the write for block b (already modified, read at rev) after
// addresses were freed, and whether it deletes the block. An emptied block
// with no affinity is deleted at once (as in Calico: nobody routes it); an
// emptied affine block stays until the grace period has passed
// (ReleaseEmptyBlocks), unless the engine releases immediately, in which
// case block and affinity go in this very transaction.
func (e *Engine) releaseOps(b *block, rev int64) ([]datastore.Op, bool) {
	if b.empty() {
		if b.Affinity == "" {
			return []datastore.Op{datastore.Delete(blockKey(b.prefix), rev)}, true
		}
		if e.grace < 0 {
			return []datastore.Op{
				datastore.Delete(blockKey(b.prefix), rev),
				datastore.Delete(affinityKey(b.host(), b.prefix), 0),
			}, true
		}
	}
	return []datastore.Op{datastore.Update(blockKey(b.prefix), b.value(), rev)}, false
}

// releaseIntentTTL is how long ExpectRelease's word holds: longer than
// dockerd's retries of a call to the plugin (15 s), short enough that an
// address later served to another network driver is released normally.
const releaseIntentTTL = 2 * time.Minute

type releaseIntent struct {
	handles []string
	at      time.Time
}

// ExpectRelease says that releases of ip by address (ReleaseIP) are meant
// for the assignment of one of handles (an endpoint's: one per address):
// the network driver knows them from the endpoint record when Docker
// deletes the endpoint, but Docker's ReleaseAddress, which follows, names
// only the address. Until the intent expires, ReleaseIP frees ip only while
// one of handles holds it, so a late or repeated release cannot free the
// address from its next holder.
func (e *Engine) ExpectRelease(ip net.IP, handles ...string) {
	addr, ok := addrFromIP(ip)
	if !ok || len(handles) == 0 {
		return
	}
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.intents == nil {
		e.intents = map[netip.Addr]releaseIntent{}
	}
	for a, in := range e.intents {
		if now.Sub(in.at) > releaseIntentTTL {
			delete(e.intents, a)
		}
	}
	e.intents[addr] = releaseIntent{handles: slices.Clone(handles), at: now}
}

// unexpectedHolder tells whether ExpectRelease named handles for addr
// (still valid) and hid is none of them.
func (e *Engine) unexpectedHolder(addr netip.Addr, hid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	in, ok := e.intents[addr]
	if !ok || e.now().Sub(in.at) > releaseIntentTTL {
		return false
	}
	return !slices.Contains(in.handles, hid)
}

// ReleaseIP frees one address and updates its handle in the same
// transaction. It frees whoever holds the address, unless ExpectRelease
// named the handle the release is meant for: then an address held by any
// other handle is left alone (the check and the write are one transaction,
// guarded by the block's revision). Releasing an address that is not
// allocated (never was, or already released) returns nil, so Docker's
// retries are harmless. An address outside every pool returns
// ErrNotInPool: nothing could have allocated it, so the caller is confused
// about which IPAM owns it (the driver may choose to ignore it).
func (e *Engine) ReleaseIP(ctx context.Context, ip net.IP) error {
	return e.ReleaseIPUnless(ctx, ip, nil)
}

// ReleaseIPUnless is ReleaseIP that leaves the address alone when keep
// says so of its holder. keep sees the assignment as the releasing
// transaction's guard saw it, so nothing can change between the decision
// and the write (the swarm paths use it: a node never frees the manager's
// assignments, the manager only frees its own). It sees the block's
// attributes only: no AttrAssigned (see AddressHolder).
func (e *Engine) ReleaseIPUnless(ctx context.Context, ip net.IP, keep func(Allocation) bool) error {
	addr, ok := addrFromIP(ip)
	if !ok {
		return newError(ErrInvalidArgument, "no valid IP address given (%v)", ip)
	}
	pool, ok, err := e.poolContaining(ctx, addr)
	if err != nil {
		return err
	}
	if !ok {
		ps, _ := e.cachedPools(ctx)
		return newError(ErrNotInPool, "cannot release %s: it is not in any IP pool (pools: %s), so calico-ipam never assigned it", addr, poolNames(ps))
	}
	bp := blockOf(addr, pool.BlockSize)
	ord, _ := ordinalOf(bp, addr)
	// Releases of one block inside this process take turns: `docker rm` of
	// many containers at once would otherwise all race for the same block
	// record, and with one winner per round most would run out of attempts
	// (leaking their addresses). The key cannot clash with a host name,
	// which has no '/'.
	bl := e.host("release/" + bp.String())
	if err := bl.lock(ctx); err != nil {
		return err
	}
	defer bl.unlock()
	fresh := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		b, rev, exists, err := e.loadBlock(ctx, bp, fresh)
		if err != nil {
			return err
		}
		if !exists {
			return nil
		}
		hid, taken := b.handleAt(ord)
		if !taken {
			if !fresh {
				fresh = true // our copy may predate the assignment
				continue
			}
			return nil
		}
		if e.unexpectedHolder(addr, hid) {
			if !fresh {
				fresh = true // our copy may predate the expected holder's release
				continue
			}
			e.log.WithFields(logrus.Fields{"ip": addr.String(), "handle": hid}).Info("not releasing: the address is held by another assignment than the release is meant for (a late or repeated release)")
			return nil
		}
		if keep != nil && keep(b.allocation(ord)) {
			if !fresh {
				fresh = true // decide on etcd's copy, not the cache's
				continue
			}
			e.log.WithFields(logrus.Fields{"ip": addr.String(), "handle": hid}).Debug("release declined: the holder is not the releaser's to free")
			return nil
		}
		h, err := e.handleCachedOrRead(ctx, hid)
		if err != nil {
			return err
		}
		err = e.commitRelease(ctx, addr, bp, b, rev, ord, h)
		if err == nil {
			return nil
		}
		if !errors.Is(err, datastore.ErrConflict) {
			return err
		}
		if _, err := e.readHandle(ctx, hid); err != nil {
			return err
		}
		fresh = true
	}
	return fmt.Errorf("releasing %s: still conflicting after %d attempts: %w", addr, maxAttempts, datastore.ErrConflict)
}

// commitRelease frees ordinal ord (addr) of block b, read at rev, from its
// holder h in one transaction that also writes h's record, each guarded by
// its revision; it returns the transaction's error (ErrConflict when block
// or handle changed) and caches what it wrote only on success.
func (e *Engine) commitRelease(ctx context.Context, addr netip.Addr, bp netip.Prefix, b *block, rev int64, ord int, h handleState) error {
	lost := b.release([]int{ord}, e.now())
	h.rec.add(bp, -lost[h.id])
	ops, deleted := e.releaseOps(b, rev)
	if op, ok := h.op(); ok {
		ops = append(ops, op)
	}
	newRev, err := e.store.TxnRev(ctx, ops...)
	if err != nil {
		return err
	}
	if deleted {
		e.uncacheBlock(bp)
	} else {
		e.cacheBlock(b, newRev)
	}
	h.rev = newRev
	e.cacheHandle(h)
	e.log.WithFields(logrus.Fields{"ip": addr.String(), "block": bp.String(), "handle": h.id, "blockReleased": deleted}).Debug("address released")
	return nil
}

// ReleaseByHandle frees every address held by handleID, one block per
// transaction (each leaves block and handle consistent), and deletes the
// handle. An unknown handle returns nil.
func (e *Engine) ReleaseByHandle(ctx context.Context, handleID string) error {
	if err := validHandle(handleID); err != nil {
		return err
	}
	log := e.log.WithField("handle", handleID)
	h, err := e.readHandle(ctx, handleID)
	if err != nil {
		return err
	}
	for conflicts := 0; conflicts < maxAttempts; {
		if h.rev == 0 {
			return nil
		}
		cidrs := make([]string, 0, len(h.rec.Blocks))
		for c := range h.rec.Blocks {
			cidrs = append(cidrs, c)
		}
		sort.Strings(cidrs)
		var ops []datastore.Op
		var b *block
		var deleted bool
		if len(cidrs) == 0 {
			ops = append(ops, datastore.Delete(handleKey(handleID), h.rev))
		} else {
			cidr := cidrs[0]
			delete(h.rec.Blocks, cidr)
			if ops, b, deleted, err = e.releaseHandleInBlockOps(ctx, log, handleID, cidr); err != nil {
				return err
			}
			if op, ok := h.op(); ok {
				ops = append(ops, op)
			}
		}
		newRev, err := e.store.TxnRev(ctx, ops...)
		if err == nil {
			if b != nil {
				if deleted {
					e.uncacheBlock(b.prefix)
				} else {
					e.cacheBlock(b, newRev)
				}
				log.WithField("block", b.CIDR).Debug("released handle's addresses in block")
			}
			if h.rec.total() == 0 {
				e.uncacheHandle(handleID)
				return nil
			}
			h.rev = newRev
			e.cacheHandle(h)
			continue
		}
		if !errors.Is(err, datastore.ErrConflict) {
			return err
		}
		conflicts++
		if b != nil {
			e.uncacheBlock(b.prefix)
		}
		if h, err = e.readHandle(ctx, handleID); err != nil {
			return err
		}
	}
	return fmt.Errorf("releasing handle %s: still conflicting after %d attempts: %w", handleID, maxAttempts, datastore.ErrConflict)
}

// releaseHandleInBlockOps is the write that frees handleID's addresses in
// block cidr: the modified block b (nil when nothing in it changes) and
// whether the write deletes it. A block left unchanged, or missing, is
// still checked at the revision read, so that the handle's write fails if
// the block changed meanwhile.
func (e *Engine) releaseHandleInBlockOps(ctx context.Context, log logrus.FieldLogger, handleID, cidr string) (ops []datastore.Op, b *block, deleted bool, err error) {
	bp, perr := netip.ParsePrefix(cidr)
	var rev int64
	exists := false
	if perr == nil {
		if b, rev, exists, err = e.blockFor(ctx, bp); err != nil {
			return nil, nil, false, err
		}
	}
	if !exists {
		log.WithField("block", cidr).Warn("handle refers to a block that does not exist; dropping the reference")
		if perr == nil {
			ops = append(ops, datastore.Check(blockKey(bp), 0))
		}
		return ops, nil, false, nil
	}
	if ords := b.ordinalsOf(handleID); len(ords) > 0 {
		b.release(ords, e.now())
		ops, deleted = e.releaseOps(b, rev)
		return ops, b, deleted, nil
	}
	return []datastore.Op{datastore.Check(blockKey(bp), rev)}, nil, false, nil
}

// IPsByHandle lists the addresses held by handleID, lowest first.
func (e *Engine) IPsByHandle(ctx context.Context, handleID string) ([]net.IP, error) {
	if err := validHandle(handleID); err != nil {
		return nil, err
	}
	h, err := e.readHandle(ctx, handleID)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for cidr := range h.rec.Blocks {
		bp, err := netip.ParsePrefix(cidr)
		if err != nil {
			continue
		}
		b, _, exists, err := e.readBlock(ctx, bp)
		if err != nil {
			return nil, err
		}
		if !exists {
			continue
		}
		for _, o := range b.ordinalsOf(handleID) {
			addrs = append(addrs, nthAddr(bp, o))
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	out := make([]net.IP, len(addrs))
	for i, a := range addrs {
		out[i] = toIP(a)
	}
	return out, nil
}

// ReleaseEmptyBlocks gives back the host's affine blocks that have been
// empty for at least the grace period: block and affinity are deleted in
// one transaction guarded by the block's revision, so a block that gets an
// address meanwhile is kept. Watchers of the host see the block removed.
// The daemon calls this periodically; it returns how many blocks went.
func (e *Engine) ReleaseEmptyBlocks(ctx context.Context, host string) (int, error) {
	if err := validHost(host); err != nil {
		return 0, err
	}
	affs, err := e.store.List(ctx, hostAffinityPrefix(host))
	if err != nil {
		return 0, fmt.Errorf("listing affinities of host %s: %w", host, err)
	}
	grace := max(e.grace, 0)
	now := e.now()
	n := 0
	for _, kv := range affs {
		_, p, ok := parseAffinityKey(kv.Key)
		if !ok {
			continue
		}
		b, rev, exists, err := e.readBlock(ctx, p)
		if err != nil {
			return n, err
		}
		log := e.log.WithFields(logrus.Fields{"host": host, "block": p.String()})
		if !exists {
			// An affinity without its block routes nothing: drop it.
			if err := e.store.Txn(ctx, datastore.Delete(kv.Key, kv.ModRevision), datastore.Check(blockKey(p), 0)); err != nil && !errors.Is(err, datastore.ErrConflict) {
				return n, err
			}
			continue
		}
		if b.Affinity != affinityOf(host) || !b.empty() {
			continue
		}
		if b.EmptiedAt != nil && now.Sub(*b.EmptiedAt) < grace {
			continue
		}
		err = e.store.Txn(ctx, datastore.Delete(blockKey(p), rev), datastore.Delete(kv.Key, kv.ModRevision))
		if errors.Is(err, datastore.ErrConflict) {
			log.Debug("block changed while being released, keeping it")
			continue
		}
		if err != nil {
			return n, err
		}
		e.uncacheBlock(p)
		n++
		log.Info("released empty block back to the pool")
	}
	return n, nil
}
