package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// locateAddress finds the block that holds ip (its pool gives the block
// size) and ip's ordinal in it; the block itself is not read.
func (e *Engine) locateAddress(ctx context.Context, ip net.IP) (addr netip.Addr, bp netip.Prefix, ord int, err error) {
	addr, ok := addrFromIP(ip)
	if !ok {
		return netip.Addr{}, netip.Prefix{}, 0, newError(ErrInvalidArgument, "no valid IP address given (%v)", ip)
	}
	pool, ok, err := e.poolContaining(ctx, addr)
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, 0, err
	}
	if !ok {
		return netip.Addr{}, netip.Prefix{}, 0, newError(ErrNotInPool, "address %s is not in any IP pool", addr)
	}
	bp = blockOf(addr, pool.BlockSize)
	ord, _ = ordinalOf(bp, addr)
	return addr, bp, ord, nil
}

// AddressHolder returns the assignment holding ip, read from etcd (not the
// cache: another host may have assigned it a moment ago); found is false
// when the address is free. An address outside every pool is ErrNotInPool.
// Its attributes are the block's: no AttrAssigned for an assignment that
// keeps its time in its handle record, which is not read (CreateEndpoint
// asks for every address; UpdateHolder and Allocations give the time).
//
// The swarm path needs it: the manager assigns a task's address, and the
// node that runs the task must tell that address (which it uses without
// assigning) from one a local container holds.
func (e *Engine) AddressHolder(ctx context.Context, ip net.IP) (a Allocation, found bool, err error) {
	_, bp, ord, err := e.locateAddress(ctx, ip)
	if err != nil {
		return Allocation{}, false, err
	}
	b, _, exists, err := e.readBlock(ctx, bp)
	if err != nil || !exists {
		return Allocation{}, false, err
	}
	if _, taken := b.handleAt(ord); !taken {
		return Allocation{}, false, nil
	}
	return b.allocation(ord), true, nil
}

// UpdateHolder lets decide look at the assignment holding ip and, in the
// same transaction (guarded by the block's and the handle's revisions),
// replace its attributes: decide returns the new attributes (the engine
// stamps the assignment anew, see handleRecord), nil to leave them, or an
// error to refuse, which
// UpdateHolder returns. found is false when the address is free (decide is
// not called). The swarm manager uses it to take over, after a restart, an
// assignment its previous life made.
func (e *Engine) UpdateHolder(ctx context.Context, ip net.IP, decide func(Allocation) (map[string]string, error)) (a Allocation, found bool, err error) {
	addr, bp, ord, err := e.locateAddress(ctx, ip)
	if err != nil {
		return Allocation{}, false, err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		b, rev, exists, err := e.readBlock(ctx, bp)
		if err != nil || !exists {
			return Allocation{}, false, err
		}
		h, taken := b.handleAt(ord)
		if !taken {
			return Allocation{}, false, nil
		}
		hs, err := e.readHandle(ctx, h)
		if err != nil {
			return Allocation{}, false, err
		}
		a := withStamp(b.allocation(ord), hs.rec)
		attrs, err := decide(a)
		if err != nil || attrs == nil {
			return a, true, err
		}
		attrs = maps.Clone(attrs)
		if hs.rev != 0 {
			delete(attrs, AttrAssigned)
			hs.rec.Assigned = e.stamp()
		} else {
			// No handle record (ipam check repairs that): the stamp
			// goes with the block's attributes, as it did before
			// handle records carried it.
			attrs[AttrAssigned] = e.stamp()
		}
		b.relabel(ord, attrs)
		ops := []datastore.Op{datastore.Update(blockKey(bp), b.value(), rev),
			datastore.Check(handleKey(h), 0)} // still none
		if hs.rev != 0 {
			ops[1] = datastore.Update(handleKey(h), datastore.MustJSON(hs.rec), hs.rev)
		}
		newRev, err := e.store.TxnRev(ctx, ops...)
		if errors.Is(err, datastore.ErrConflict) {
			e.uncacheHandle(h)
			continue
		}
		if err != nil {
			e.uncacheBlock(bp)
			e.uncacheHandle(h)
			return a, true, err
		}
		e.cacheBlock(b, newRev)
		if hs.rev != 0 {
			hs.rev = newRev
			e.cacheHandle(hs)
		}
		return withStamp(b.allocation(ord), hs.rec), true, nil
	}
	return Allocation{}, false, fmt.Errorf("updating the assignment of %s: still conflicting after %d attempts: %w", addr, maxAttempts, datastore.ErrConflict)
}
