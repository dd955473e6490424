package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Pool is an IP pool (record pools/<cidr>).
type Pool struct {
	CIDR        string `json:"cidr"`
	BlockSize   int    `json:"blockSize"`
	NATOutgoing bool   `json:"natOutgoing"`
	Disabled    bool   `json:"disabled"`
	IPIPMode    string `json:"ipipMode,omitempty"`
	// VXLANMode says when traffic between hosts to this pool's addresses
	// is encapsulated (see the VXLANMode constants); "" means Never.
	VXLANMode string `json:"vxlanMode,omitempty"`
}

// DefaultPoolIPv4 is created by EnsureDefaultPool when there is no IPv4 pool.
const DefaultPoolIPv4 = "192.168.0.0/16"

// Default and allowed block sizes, as in Calico: a /26 (64 addresses) keeps
// route tables small and wastes little per host; blocks are limited to 4096
// addresses so a block record stays a few tens of KB.
const (
	DefaultBlockSizeIPv4 = 26
	DefaultBlockSizeIPv6 = 122
	minBlockSizeIPv4     = 20
	minBlockSizeIPv6     = 116
)

// Ranges a pool may not touch: workloads there would be unreachable or would
// shadow the 169.254.1.1 gateway every container uses.
var reservedRanges = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\" range 0.0.0.0/8"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback range 127.0.0.0/8"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local range 169.254.0.0/16 (the containers' gateway 169.254.1.1 lives there)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast range 224.0.0.0/4"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved range 240.0.0.0/4"},
	{netip.MustParsePrefix("::/128"), "unspecified address ::"},
	{netip.MustParsePrefix("::1/128"), "loopback address ::1"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped range ::ffff:0:0/96"},
	{netip.MustParsePrefix("fe80::/10"), "link-local range fe80::/10"},
	{netip.MustParsePrefix("ff00::/8"), "multicast range ff00::/8"},
}

// poolEntry is a pool as read, with the revision assignments compare so that
// disabling or deleting a pool stops every host from using it.
type poolEntry struct {
	Pool
	prefix netip.Prefix
	rev    int64
}

// parseCIDR parses a network in canonical form.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, newError(ErrInvalidCIDR, "invalid CIDR %q: expected a network such as 10.1.0.0/16 or fd00:1::/64", s)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, newError(ErrInvalidCIDR, "invalid CIDR %q: zones are not allowed", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, newError(ErrInvalidCIDR, "invalid CIDR %q: host bits are set, did you mean %s?", s, m)
	}
	return p, nil
}

// normalizePool validates p and fills in defaults.
func normalizePool(p Pool) (Pool, netip.Prefix, error) {
	pfx, err := parseCIDR(p.CIDR)
	if err != nil {
		return Pool{}, netip.Prefix{}, err
	}
	p.CIDR = pfx.String()
	for _, r := range reservedRanges {
		if r.prefix.Overlaps(pfx) {
			return Pool{}, netip.Prefix{}, newError(ErrInvalidCIDR, "pool %s overlaps the %s; choose a private range such as 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or fd00::/8", pfx, r.why)
		}
	}
	minBlock, maxBlock, def := minBlockSizeIPv4, 32, DefaultBlockSizeIPv4
	if pfx.Addr().Is6() {
		minBlock, maxBlock, def = minBlockSizeIPv6, 128, DefaultBlockSizeIPv6
	}
	if p.BlockSize == 0 {
		p.BlockSize = def
		if p.BlockSize < pfx.Bits() {
			// A pool smaller than a default block is one block.
			p.BlockSize = pfx.Bits()
		}
	}
	if p.BlockSize < minBlock || p.BlockSize > maxBlock {
		return Pool{}, netip.Prefix{}, newError(ErrInvalidCIDR, "block size /%d for pool %s is out of range: it must be between /%d and /%d (default /%d)", p.BlockSize, pfx, minBlock, maxBlock, def)
	}
	if p.BlockSize < pfx.Bits() {
		return Pool{}, netip.Prefix{}, newError(ErrInvalidCIDR, "pool %s is smaller than its block size /%d: use a block size of at least /%d or a larger pool", pfx, p.BlockSize, pfx.Bits())
	}
	if err := validateEncap(&p, pfx); err != nil {
		return Pool{}, netip.Prefix{}, err
	}
	return p, pfx, nil
}

func decodePool(kv datastore.KV) (poolEntry, error) {
	var p Pool
	if err := json.Unmarshal(kv.Value, &p); err != nil {
		return poolEntry{}, fmt.Errorf("decoding pool %s: %w", kv.Key, err)
	}
	pfx, err := netip.ParsePrefix(p.CIDR)
	if err != nil {
		return poolEntry{}, fmt.Errorf("pool %s has an invalid cidr %q", kv.Key, p.CIDR)
	}
	return poolEntry{Pool: p, prefix: pfx, rev: kv.ModRevision}, nil
}

func sortPools(ps []poolEntry) {
	slices.SortFunc(ps, func(a, b poolEntry) int { return comparePoolPrefixes(a.prefix, b.prefix) })
}

// comparePoolPrefixes is the order pools are listed and tried in: IPv4
// first, then by address.
func comparePoolPrefixes(a, b netip.Prefix) int {
	if a.Addr().Is4() != b.Addr().Is4() {
		if a.Addr().Is4() {
			return -1
		}
		return 1
	}
	return comparePrefix(a, b)
}

// loadPools reads all pools and refreshes the cache.
func (e *Engine) loadPools(ctx context.Context) ([]poolEntry, error) {
	kvs, err := e.store.List(ctx, PoolsPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing IP pools: %w", err)
	}
	out := make([]poolEntry, 0, len(kvs))
	for _, kv := range kvs {
		p, err := decodePool(kv)
		if err != nil {
			e.log.WithError(err).WithField("key", kv.Key).Warn("ignoring unreadable pool record")
			continue
		}
		out = append(out, p)
	}
	sortPools(out)
	e.mu.Lock()
	e.pools = out
	e.mu.Unlock()
	return slices.Clone(out), nil
}

// cachedPools is the cached pool list (loading it the first time). Writes
// that rely on a pool compare its revision, so a stale list is caught.
func (e *Engine) cachedPools(ctx context.Context) ([]poolEntry, error) {
	e.mu.Lock()
	ps := e.pools
	e.mu.Unlock()
	if ps != nil {
		return slices.Clone(ps), nil
	}
	return e.loadPools(ctx)
}

func (e *Engine) invalidatePools() {
	e.mu.Lock()
	e.pools = nil
	e.mu.Unlock()
}

// poolContaining finds the pool holding a (disabled ones included). It
// re-reads the pools once when the cached list has none, in case the pool
// was added by another process.
func (e *Engine) poolContaining(ctx context.Context, a netip.Addr) (poolEntry, bool, error) {
	for attempt := 0; attempt < 2; attempt++ {
		var ps []poolEntry
		var err error
		if attempt == 0 {
			ps, err = e.cachedPools(ctx)
		} else {
			ps, err = e.loadPools(ctx)
		}
		if err != nil {
			return poolEntry{}, false, err
		}
		for _, p := range ps {
			if p.prefix.Contains(a) {
				return p, true, nil
			}
		}
	}
	return poolEntry{}, false, nil
}

func poolNames(ps []poolEntry) string {
	if len(ps) == 0 {
		return "none"
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.CIDR
	}
	return strings.Join(names, ", ")
}

func (e *Engine) readSerial(ctx context.Context) (int64, int64, error) {
	var n int64
	rev, err := e.store.GetJSON(ctx, poolsSerialKey, &n)
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return 0, 0, err
	}
	return n, rev, nil
}

// AddPool validates p, fills in the default block size and stores it. The
// pool must not overlap any existing pool (ErrPoolOverlap names it).
func (e *Engine) AddPool(ctx context.Context, p Pool) (Pool, error) {
	p, pfx, err := normalizePool(p)
	if err != nil {
		return Pool{}, err
	}
	err = e.store.Retry(ctx, func(ctx context.Context) error {
		serial, serialRev, err := e.readSerial(ctx)
		if err != nil {
			return err
		}
		existing, err := e.loadPools(ctx)
		if err != nil {
			return err
		}
		for _, x := range existing {
			if x.prefix == pfx {
				return newError2(ErrPoolExists, ErrPoolOverlap, "pool %s already exists", pfx)
			}
			if x.prefix.Overlaps(pfx) {
				return newError(ErrPoolOverlap, "pool %s overlaps existing pool %s: pools must be disjoint; pick another range or delete %s first", pfx, x.CIDR, x.CIDR)
			}
		}
		return e.store.Txn(ctx,
			datastore.Create(poolKey(pfx), datastore.MustJSON(p)),
			datastore.Write(poolsSerialKey, datastore.MustJSON(serial+1), serialRev))
	})
	e.invalidatePools()
	if err != nil {
		return Pool{}, err
	}
	e.log.WithFields(logrus.Fields{"pool": p.CIDR, "blockSize": p.BlockSize}).Info("IP pool added")
	return p, nil
}

// ListPools returns all pools, IPv4 first, by address.
func (e *Engine) ListPools(ctx context.Context) ([]Pool, error) {
	ps, err := e.loadPools(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Pool, len(ps))
	for i, p := range ps {
		out[i] = p.Pool
	}
	return out, nil
}

func (e *Engine) getPool(ctx context.Context, cidr string) (poolEntry, error) {
	pfx, err := parseCIDR(cidr)
	if err != nil {
		return poolEntry{}, err
	}
	kv, err := e.store.Get(ctx, poolKey(pfx))
	if errors.Is(err, datastore.ErrNotFound) {
		return poolEntry{}, newError(ErrPoolNotFound, "no IP pool %s (see `pool list`)", pfx)
	}
	if err != nil {
		return poolEntry{}, err
	}
	return decodePool(kv)
}

// GetPool returns the pool with exactly this CIDR.
func (e *Engine) GetPool(ctx context.Context, cidr string) (Pool, error) {
	p, err := e.getPool(ctx, cidr)
	return p.Pool, err
}

// SetPoolDisabled enables or disables a pool. A disabled pool hands out no
// new addresses (not even from blocks already affine to a host); existing
// assignments stay and can be released.
func (e *Engine) SetPoolDisabled(ctx context.Context, cidr string, disabled bool) error {
	err := e.store.Retry(ctx, func(ctx context.Context) error {
		p, err := e.getPool(ctx, cidr)
		if err != nil {
			return err
		}
		if p.Disabled == disabled {
			return nil
		}
		p.Disabled = disabled
		return e.store.Txn(ctx, datastore.Update(poolKey(p.prefix), datastore.MustJSON(p.Pool), p.rev))
	})
	e.invalidatePools()
	if err == nil {
		e.log.WithFields(logrus.Fields{"pool": cidr, "disabled": disabled}).Info("IP pool updated")
	}
	return err
}

// poolBlocks lists the blocks inside pfx with their revisions.
func (e *Engine) poolBlocks(ctx context.Context, pfx netip.Prefix) ([]cachedBlock, error) {
	kvs, err := e.store.List(ctx, blocksPrefix)
	if err != nil {
		return nil, err
	}
	var out []cachedBlock
	for _, kv := range kvs {
		b, err := decodeBlock(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		if pfx.Overlaps(b.prefix) {
			out = append(out, cachedBlock{b: b, rev: kv.ModRevision})
		}
	}
	return out, nil
}

func inUseError(pfx netip.Prefix, blocks []cachedBlock) error {
	n, example := 0, ""
	for _, c := range blocks {
		for o := range c.b.Allocations {
			if h, ok := c.b.handleAt(o); ok {
				if _, tunnel := TunnelHandleNode(h); tunnel {
					continue // released by DeletePool itself
				}
				if n == 0 {
					example = fmt.Sprintf("%s (handle %s)", nthAddr(c.b.prefix, o), h)
				}
				n++
			}
		}
	}
	if n == 0 {
		return nil
	}
	return newError(ErrPoolInUse, "pool %s still has %d allocated address(es), e.g. %s: remove those containers (or `ipam release` the addresses) first, or disable the pool instead", pfx, n, example)
}

// deleteBatch bounds the operations of one cleanup transaction, well under
// etcd's default limit of 128 per transaction.
const deleteBatch = 40

// DeletePool removes a pool that has no allocated address, together with its
// (empty) blocks and their affinities. It first disables the pool so that no
// host can assign from it while the blocks are removed; if an assignment
// slipped in before that, the pool is re-enabled and ErrPoolInUse returned.
// An interrupted deletion leaves a disabled pool; running it again finishes.
func (e *Engine) DeletePool(ctx context.Context, cidr string) error {
	p, err := e.getPool(ctx, cidr)
	if err != nil {
		return err
	}
	pfx := p.prefix
	blocks, err := e.poolBlocks(ctx, pfx)
	if err != nil {
		return err
	}
	if err := inUseError(pfx, blocks); err != nil {
		return err
	}
	wasDisabled := p.Disabled
	if !wasDisabled {
		if err := e.SetPoolDisabled(ctx, cidr, true); err != nil {
			return err
		}
	}
	// From here on every assignment into the pool fails its pool check, so
	// what we read now can only shrink. The nodes' VTEP addresses go first:
	// their managers take one from another VXLAN pool, or tear down.
	if err := e.releaseTunnelAddresses(ctx, blocks); err != nil {
		return err
	}
	err = e.store.Retry(ctx, func(ctx context.Context) error {
		return e.deleteDisabledPool(ctx, cidr, pfx)
	})
	e.invalidatePools()
	if err != nil {
		if errors.Is(err, ErrPoolInUse) && !wasDisabled {
			if rerr := e.SetPoolDisabled(ctx, cidr, false); rerr != nil {
				e.log.WithError(rerr).WithField("pool", cidr).Warn("could not re-enable pool after a refused deletion")
			}
		}
		return err
	}
	e.log.WithFields(logrus.Fields{"pool": pfx.String(), "blocks": len(blocks)}).Info("IP pool deleted")
	return nil
}

// deleteDisabledPool is one attempt (DeletePool retries it) at removing the
// disabled pool pfx: it re-reads the blocks, refuses with ErrPoolInUse if
// any address is allocated, deletes blocks and affinities (each guarded by
// the revision read), then the pool record with a bump of the pools serial.
// A pool already gone counts as deleted.
func (e *Engine) deleteDisabledPool(ctx context.Context, cidr string, pfx netip.Prefix) error {
	blocks, err := e.poolBlocks(ctx, pfx)
	if err != nil {
		return err
	}
	if err := inUseError(pfx, blocks); err != nil {
		return err
	}
	affs, err := e.store.List(ctx, affinityPrefix)
	if err != nil {
		return err
	}
	if err := e.deletePoolBlocks(ctx, pfx, blocks, affs); err != nil {
		return err
	}
	serial, serialRev, err := e.readSerial(ctx)
	if err != nil {
		return err
	}
	cur, err := e.getPool(ctx, cidr)
	if err != nil {
		if errors.Is(err, ErrPoolNotFound) {
			return nil
		}
		return err
	}
	return e.store.Txn(ctx,
		datastore.Delete(poolKey(pfx), cur.rev),
		datastore.Write(poolsSerialKey, datastore.MustJSON(serial+1), serialRev))
}

// deletePoolBlocks deletes blocks and then the affinities (among affs) of
// blocks inside pfx, deleteBatch operations per transaction, each guarded
// by the revision it was read at.
func (e *Engine) deletePoolBlocks(ctx context.Context, pfx netip.Prefix, blocks []cachedBlock, affs []datastore.KV) error {
	var ops []datastore.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := e.store.Txn(ctx, ops...)
		ops = ops[:0]
		return err
	}
	for _, c := range blocks {
		ops = append(ops, datastore.Delete(blockKey(c.b.prefix), c.rev))
		e.uncacheBlock(c.b.prefix)
		if len(ops) >= deleteBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	for _, kv := range affs {
		if _, bp, ok := parseAffinityKey(kv.Key); ok && pfx.Overlaps(bp) {
			ops = append(ops, datastore.Delete(kv.Key, kv.ModRevision))
			if len(ops) >= deleteBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// EnsureDefaultPool returns the first enabled IPv4 pool, creating
// DefaultPoolIPv4 when there is no IPv4 pool at all. Hosts racing to create
// it agree on one record.
func (e *Engine) EnsureDefaultPool(ctx context.Context) (Pool, error) {
	for attempt := 0; attempt < 3; attempt++ {
		ps, err := e.loadPools(ctx)
		if err != nil {
			return Pool{}, err
		}
		var v4 []poolEntry
		for _, p := range ps {
			if p.prefix.Addr().Is4() {
				v4 = append(v4, p)
			}
		}
		for _, p := range v4 {
			if !p.Disabled {
				return p.Pool, nil
			}
		}
		if len(v4) > 0 {
			return Pool{}, newError(ErrPoolDisabled, "every IPv4 pool is disabled (%s): enable one with `pool enable` or add a new pool", poolNames(v4))
		}
		p, err := e.AddPool(ctx, Pool{CIDR: DefaultPoolIPv4, NATOutgoing: true})
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, ErrPoolOverlap) {
			return Pool{}, fmt.Errorf("creating the default pool %s: %w", DefaultPoolIPv4, err)
		}
		// Another host created a pool meanwhile: look again.
	}
	return Pool{}, fmt.Errorf("creating the default pool %s: pools keep changing, try again", DefaultPoolIPv4)
}

// FindPool returns the pool equal to or containing subnet.
func (e *Engine) FindPool(ctx context.Context, subnet *net.IPNet) (Pool, error) {
	sub, err := prefixFromIPNet(subnet)
	if err != nil {
		return Pool{}, err
	}
	ps, err := e.loadPools(ctx)
	if err != nil {
		return Pool{}, err
	}
	for _, p := range ps {
		if p.prefix.Bits() <= sub.Bits() && p.prefix.Contains(sub.Addr()) {
			return p.Pool, nil
		}
	}
	return Pool{}, newError(ErrPoolNotFound, "no IP pool contains %s (pools: %s); add one with `pool add %s`", sub, poolNames(ps), sub)
}

// usablePools picks the pools an auto-assignment may use: right family,
// overlapping within, enabled. The error says which of those was missing.
func usablePools(ps []poolEntry, v6 bool, within *netip.Prefix) ([]poolEntry, error) {
	fam := "IPv4"
	if v6 {
		fam = "IPv6"
	}
	var cand []poolEntry
	for _, p := range ps {
		if p.prefix.Addr().Is6() != v6 {
			continue
		}
		if within != nil && !p.prefix.Overlaps(*within) {
			continue
		}
		cand = append(cand, p)
	}
	if len(cand) == 0 {
		if within != nil {
			return nil, newError(ErrPoolNotFound, "no IP pool overlaps subnet %s: add a pool for it (`pool add %s`) or use a subnet inside an existing pool", *within, *within)
		}
		return nil, newError(ErrPoolNotFound, "no %s pool is configured: add one with `pool add`", fam)
	}
	var enabled []poolEntry
	for _, p := range cand {
		if !p.Disabled {
			enabled = append(enabled, p)
		}
	}
	if len(enabled) == 0 {
		if len(cand) == 1 {
			return nil, newError(ErrPoolDisabled, "%s pool %s is disabled: enable it with `pool enable` or add a new pool", fam, cand[0].CIDR)
		}
		return nil, newError(ErrPoolDisabled, "%s pools %s are all disabled: enable one with `pool enable` or add a new pool", fam, poolNames(cand))
	}
	return enabled, nil
}

// span is the part of pool p an assignment restricted to within may use.
func span(p poolEntry, within *netip.Prefix) netip.Prefix {
	if within != nil && within.Bits() > p.prefix.Bits() {
		return *within
	}
	return p.prefix
}
