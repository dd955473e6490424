package ipam

import (
	"context"
	"maps"
	"net"
)

// AddressHolder returns the assignment holding ip, read from etcd (not the
// cache: another host may have assigned it a moment ago); found is false
// when the address is free. An address outside every pool is ErrNotInPool.
//
// The swarm path needs it: the manager assigns a task's address, and the
// node that runs the task must tell that address (which it uses without
// assigning) from one a local container holds.
func (e *Engine) AddressHolder(ctx context.Context, ip net.IP) (a Allocation, found bool, err error) {
	addr, ok := addrFromIP(ip)
	if !ok {
		return Allocation{}, false, newError(ErrInvalidArgument, "no valid IP address given (%v)", ip)
	}
	pool, ok, err := e.poolContaining(ctx, addr)
	if err != nil {
		return Allocation{}, false, err
	}
	if !ok {
		return Allocation{}, false, newError(ErrNotInPool, "address %s is not in any IP pool", addr)
	}
	bp := blockOf(addr, pool.BlockSize)
	b, _, exists, err := e.readBlock(ctx, bp)
	if err != nil || !exists {
		return Allocation{}, false, err
	}
	ord, _ := ordinalOf(bp, addr)
	h, taken := b.handleAt(ord)
	if !taken {
		return Allocation{}, false, nil
	}
	return Allocation{
		IP:       toIP(addr),
		HandleID: h,
		Attrs:    maps.Clone(b.Attributes[*b.Allocations[ord]].Secondary),
		Block:    b.CIDR,
		Host:     b.host(),
	}, true, nil
}
