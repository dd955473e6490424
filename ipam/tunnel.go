package ipam

import (
	"context"
	"fmt"

	"net/netip"
)

// AffinityWatchPrefix is the key prefix of every host's block affinities:
// routing watches it to follow which host owns which block.
const AffinityWatchPrefix = affinityPrefix

// BlockOwners maps every block confirmed affine to a host to that host.
func (e *Engine) BlockOwners(ctx context.Context) (map[netip.Prefix]string, error) {
	kvs, err := e.store.List(ctx, affinityPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing block affinities: %w", err)
	}
	out := make(map[netip.Prefix]string, len(kvs))
	for _, kv := range kvs {
		host, p, ok := parseAffinityKey(kv.Key)
		if !ok {
			continue
		}
		if _, confirmed := confirmedAffinity(kv.Key, kv.Value); confirmed {
			out[p] = host
		}
	}
	return out, nil
}

// EnsureTunnelAddress returns node's VTEP address: the one its tunnel
// handle holds when that lies in one of pools, else a new one from a block
// of node's own in the first of pools (claiming a block if it has none
// there). An address held in a pool no longer listed is released first.
func (e *Engine) EnsureTunnelAddress(ctx context.Context, node string, pools []netip.Prefix) (netip.Addr, error) {
	if len(pools) == 0 {
		return netip.Addr{}, newError(ErrInvalidArgument, "no VXLAN pool to take a tunnel address from")
	}
	handle := VXLANTunnelHandle(node)
	held, err := e.IPsByHandle(ctx, handle)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, ip := range held {
		a, ok := addrFromIP(ip)
		if !ok {
			continue
		}
		for _, p := range pools {
			if p.Contains(a) && len(held) == 1 {
				return a, nil
			}
		}
	}
	if len(held) > 0 {
		if err := e.ReleaseByHandle(ctx, handle); err != nil {
			return netip.Addr{}, fmt.Errorf("releasing the old tunnel address of %s: %w", node, err)
		}
	}
	attrs := map[string]string{AttrType: AttrTypeVXLANTunnel}
	var lastErr error
	for _, p := range pools {
		within := toIPNet(p)
		n, err := e.AutoAssign(ctx, AutoAssignArgs{Host: node, HandleID: handle, Attrs: attrs, Within: &within})
		if err == nil {
			a, _ := addrFromIP(n.IP)
			return a, nil
		}
		lastErr = err
	}
	return netip.Addr{}, fmt.Errorf("assigning a VXLAN tunnel address to %s: %w", node, lastErr)
}

// ReleaseTunnelAddress gives node's VTEP address back (nil when it has
// none).
func (e *Engine) ReleaseTunnelAddress(ctx context.Context, node string) error {
	return e.ReleaseByHandle(ctx, VXLANTunnelHandle(node))
}

// releaseTunnelAddresses releases every VTEP address held in blocks.
func (e *Engine) releaseTunnelAddresses(ctx context.Context, blocks []cachedBlock) error {
	seen := map[string]bool{}
	for _, c := range blocks {
		for o := range c.b.Allocations {
			h, ok := c.b.handleAt(o)
			if _, tunnel := TunnelHandleNode(h); !ok || !tunnel || seen[h] {
				continue
			}
			seen[h] = true
			if err := e.ReleaseByHandle(ctx, h); err != nil {
				return fmt.Errorf("releasing VXLAN tunnel address %s: %w", h, err)
			}
		}
	}
	return nil
}
