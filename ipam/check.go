package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// BlockUsage is one block as `ipam show` prints it.
type BlockUsage struct {
	CIDR string
	Pool string // "" when the block lies outside every pool
	Host string // "" when the block has no affinity
	Size int
	Used int
}

// Allocation is one assigned address.
type Allocation struct {
	IP       net.IP
	HandleID string
	Attrs    map[string]string
	Block    string
	Host     string // the block's host, not necessarily the workload's (borrowing)
}

// LeakRules say when an assignment is certainly dead, hence a leak that
// Fix may release. Every address of the handle must be:
//   - in use by nothing (InUse false: no endpoint record, not on any of
//     Docker's endpoints);
//   - neither the swarm manager's (its tasks and service VIPs have no
//     endpoint record; the manager releases them) nor an aux/gateway
//     reservation (AttrReserved);
//   - older than MinAge by its AttrAssigned stamp: Docker holds an address
//     without an endpoint between RequestAddress and CreateEndpoint, and
//     retries calls to the plugin for a while;
//   - of a node whose Docker was asked (Verified): only that Docker knows
//     the node's containers;
//   - for a VTEP address (a tunnel handle), of a node that no longer has a
//     record (NodeKnown false); Docker is not asked, it never knew it.
//
// A handle that would be a leak but for an unknown age (assigned before
// the engine stamped assignments) or an unasked Docker is Unverified:
// reported, never released.
type LeakRules struct {
	Now    time.Time
	MinAge time.Duration
	// InUse tells whether an endpoint record or Docker shows a in use.
	InUse func(a Allocation) bool
	// Verified tells whether Docker on node was asked, so that InUse
	// covers its view.
	Verified func(node string) bool
	// NodeKnown tells whether node still has a node record (nil: every
	// node is assumed known, so no VTEP address is ever a leak).
	NodeKnown func(node string) bool
}

// Suspect is a handle that looks leaked but cannot be proven dead.
type Suspect struct {
	Handle string `json:"handle"`
	IP     string `json:"ip"`
	Node   string `json:"node"`
	Why    string `json:"why"`
}

// verdict judges one handle's addresses by the rules: leaked, or a
// suspect (non-nil), or neither (live, or too young to tell).
func (r *LeakRules) verdict(h string, as []Allocation) (leaked bool, sus *Suspect) {
	why := ""
	tunnelNode, tunnel := TunnelHandleNode(h)
	if tunnel && (r.NodeKnown == nil || r.NodeKnown(tunnelNode)) {
		return false, nil
	}
	for _, a := range as {
		if IsSwarm(a.Attrs) || IsReserved(a.Attrs) || r.InUse(a) {
			return false, nil
		}
		at, stamped := AssignedAt(a.Attrs)
		if stamped && r.Now.Sub(at) < r.MinAge {
			return false, nil
		}
		node := a.Attrs[AttrNode]
		switch {
		case why != "":
		case tunnel && stamped:
			// The VTEP's node record is gone: nothing uses the address.
		case !stamped:
			why = "its age is unknown (no assignment time recorded: assigned by an older calico-cnm, or its handle record rewritten by one)"
		case !r.Verified(node) && node == "":
			why = "no node is recorded as its owner"
		case !r.Verified(node):
			why = "Docker on node " + node + " was not asked"
		}
		if why != "" && sus == nil {
			sus = &Suspect{Handle: h, IP: a.IP.String(), Node: node}
		}
	}
	if sus != nil {
		sus.Why = why
		return false, sus
	}
	return len(as) > 0, nil
}

// Report is what Check found. Entries are sorted. Affinity entries read
// "<host>/<block-cidr>".
type Report struct {
	// LeakedHandles hold addresses that are certainly dead (LeakRules).
	LeakedHandles []string
	// Unverified look leaked but cannot be proven dead (LeakRules): they
	// are reported, never released, and not counted as problems.
	Unverified []Suspect `json:"Unverified,omitempty"`
	// OrphanedHandles are handle records with no address in any block.
	OrphanedHandles []string
	// MismatchedHandles hold addresses but their record's per-block counts
	// disagree with the blocks (or the record is missing).
	MismatchedHandles []string
	// MissingAffinities are blocks affine to a host without an affinity
	// record: that host's routing does not know it owns them.
	MissingAffinities []string
	// DanglingAffinities are affinity records whose block is gone or belongs
	// to another host.
	DanglingAffinities []string
}

// Problems counts all findings.
func (r Report) Problems() int {
	return len(r.LeakedHandles) + len(r.OrphanedHandles) + len(r.MismatchedHandles) +
		len(r.MissingAffinities) + len(r.DanglingAffinities)
}

type affEntry struct {
	key   string
	host  string
	block netip.Prefix
	state string
	rev   int64
}

// snapshot is all IPAM records read in a single etcd request, hence mutually
// consistent even while hosts keep assigning.
type snapshot struct {
	blocks     map[netip.Prefix]cachedBlock
	handles    map[string]handleState
	affinities map[string]affEntry // by "<host>/<cidr>"
}

func affID(host string, p netip.Prefix) string { return host + "/" + p.String() }

func (e *Engine) readSnapshot(ctx context.Context) (*snapshot, error) {
	kvs, err := e.store.List(ctx, recordsPrefix)
	if err != nil {
		return nil, fmt.Errorf("reading IPAM records: %w", err)
	}
	s := &snapshot{blocks: map[netip.Prefix]cachedBlock{}, handles: map[string]handleState{}, affinities: map[string]affEntry{}}
	for _, kv := range kvs {
		switch {
		case strings.HasPrefix(kv.Key, blocksPrefix):
			b, err := decodeBlock(kv.Key, kv.Value)
			if err != nil {
				return nil, err
			}
			s.blocks[b.prefix] = cachedBlock{b: b, rev: kv.ModRevision}
		case strings.HasPrefix(kv.Key, handlesPrefix):
			id := strings.TrimPrefix(kv.Key, handlesPrefix)
			var rec handleRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				e.log.WithError(err).WithField("handle", id).Warn("unreadable handle record, treating it as empty")
			}
			if rec.Blocks == nil {
				rec.Blocks = map[string]int{}
			}
			s.handles[id] = handleState{id: id, rec: rec, rev: kv.ModRevision}
		case strings.HasPrefix(kv.Key, affinityPrefix):
			host, p, ok := parseAffinityKey(kv.Key)
			if !ok {
				continue
			}
			var r affinityRecord
			_ = json.Unmarshal(kv.Value, &r)
			s.affinities[affID(host, p)] = affEntry{key: kv.Key, host: host, block: p, state: r.State, rev: kv.ModRevision}
		}
	}
	return s, nil
}

// actualHandles is, per handle, the per-block counts the blocks say.
func (s *snapshot) actualHandles() map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, c := range s.blocks {
		for h, n := range c.b.handleCounts() {
			if out[h] == nil {
				out[h] = map[string]int{}
			}
			out[h][c.b.CIDR] += n
		}
	}
	return out
}

// allocationsByHandle groups the assigned addresses by handle.
func (s *snapshot) allocationsByHandle() map[string][]Allocation {
	out := map[string][]Allocation{}
	for _, c := range s.blocks {
		for o := range c.b.Allocations {
			if h, ok := c.b.handleAt(o); ok {
				out[h] = append(out[h], withStamp(c.b.allocation(o), s.handles[h].rec))
			}
		}
	}
	return out
}

func (s *snapshot) sortedBlocks() []cachedBlock {
	out := slices.Collect(maps.Values(s.blocks))
	sortBlocks(out)
	return out
}

// Usage lists every block with its pool, host and fill.
func (e *Engine) Usage(ctx context.Context) ([]BlockUsage, error) {
	pools, err := e.loadPools(ctx)
	if err != nil {
		return nil, err
	}
	s, err := e.readSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	var out []BlockUsage
	for _, c := range s.sortedBlocks() {
		u := BlockUsage{CIDR: c.b.CIDR, Host: c.b.host(), Size: blockAddrCount(c.b.prefix), Used: c.b.used()}
		if p, ok := poolOfBlock(pools, c.b.prefix); ok {
			u.Pool = p.CIDR
		}
		out = append(out, u)
	}
	return out, nil
}

// Allocations lists every assigned address, by address.
func (e *Engine) Allocations(ctx context.Context) ([]Allocation, error) {
	s, err := e.readSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	var out []Allocation
	for _, c := range s.sortedBlocks() {
		for o := range c.b.Allocations {
			if h, ok := c.b.handleAt(o); ok {
				out = append(out, withStamp(c.b.allocation(o), s.handles[h].rec))
			}
		}
	}
	return out, nil
}

// Check audits IPAM like `calicoctl ipam check`. rules decide which
// assignments are leaks; nil skips the leak check. All records come from
// one consistent read, so a check running while hosts assign reports no
// false positives.
func (e *Engine) Check(ctx context.Context, rules *LeakRules) (Report, error) {
	s, err := e.readSnapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	var r Report
	actual := s.actualHandles()
	if rules != nil {
		for h, as := range s.allocationsByHandle() {
			leaked, sus := rules.verdict(h, as)
			if leaked {
				r.LeakedHandles = append(r.LeakedHandles, h)
			}
			if sus != nil {
				r.Unverified = append(r.Unverified, *sus)
			}
		}
		slices.SortFunc(r.Unverified, func(a, b Suspect) int { return strings.Compare(a.Handle, b.Handle) })
	}
	for h := range actual {
		if rec, ok := s.handles[h]; !ok || !maps.Equal(rec.rec.Blocks, actual[h]) {
			r.MismatchedHandles = append(r.MismatchedHandles, h)
		}
	}
	for h := range s.handles {
		if len(actual[h]) == 0 {
			r.OrphanedHandles = append(r.OrphanedHandles, h)
		}
	}
	for p, c := range s.blocks {
		if host := c.b.host(); host != "" {
			if _, ok := s.affinities[affID(host, p)]; !ok {
				r.MissingAffinities = append(r.MissingAffinities, affID(host, p))
			}
		}
	}
	for id, a := range s.affinities {
		if c, ok := s.blocks[a.block]; !ok || c.b.host() != a.host {
			r.DanglingAffinities = append(r.DanglingAffinities, id)
		}
	}
	slices.Sort(r.LeakedHandles)
	slices.Sort(r.OrphanedHandles)
	slices.Sort(r.MismatchedHandles)
	slices.Sort(r.MissingAffinities)
	slices.Sort(r.DanglingAffinities)
	return r, nil
}

// Fix repairs what a Check found. Each finding is verified again against a
// fresh read and every write is guarded by the revisions of that read, so a
// stale report cannot undo newer work: leaked handles are released,
// orphaned handle records deleted, mismatched handle records rewritten from
// the blocks, missing affinity records restored (confirmed) and dangling
// ones deleted. It returns the first error after trying everything.
func (e *Engine) Fix(ctx context.Context, r Report) error {
	s, err := e.readSnapshot(ctx)
	if err != nil {
		return err
	}
	var errs []error
	txn := func(what string, ops ...datastore.Op) {
		err := e.store.Txn(ctx, ops...)
		if errors.Is(err, datastore.ErrConflict) {
			e.log.WithField("fix", what).Info("record changed since the check, skipping")
			return
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return
		}
		e.log.WithField("fix", what).Info("repaired IPAM record")
	}
	actual := s.actualHandles()

	for _, id := range r.MissingAffinities {
		host, cidr, _ := strings.Cut(id, "/")
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			continue
		}
		c, ok := s.blocks[p]
		if _, has := s.affinities[id]; has || !ok || c.b.host() != host {
			continue
		}
		txn("restore affinity "+id,
			datastore.Create(affinityKey(host, p), datastore.MustJSON(affinityRecord{State: stateConfirmed})),
			datastore.Check(blockKey(p), c.rev))
	}
	for _, id := range r.DanglingAffinities {
		a, ok := s.affinities[id]
		if !ok {
			continue
		}
		check := datastore.Check(blockKey(a.block), 0)
		if c, ok := s.blocks[a.block]; ok {
			if c.b.host() == a.host {
				continue
			}
			check = datastore.Check(blockKey(a.block), c.rev)
		}
		txn("delete affinity "+id, datastore.Delete(a.key, a.rev), check)
	}
	for _, h := range r.OrphanedHandles {
		st, ok := s.handles[h]
		if !ok || len(actual[h]) > 0 {
			continue
		}
		e.uncacheHandle(h)
		txn("delete orphaned handle "+h, datastore.Delete(handleKey(h), st.rev))
	}
	for _, h := range r.MismatchedHandles {
		want := actual[h]
		st := s.handles[h] // zero (rev 0, must not exist) when missing
		if len(want) == 0 || (st.rev != 0 && maps.Equal(st.rec.Blocks, want)) {
			continue
		}
		e.uncacheHandle(h)
		// A handle record made (or kept) without an assignment time gets
		// now: its addresses then count as young, which errs toward
		// keeping them, where no time would let reconcile take them for
		// assignments older than handle records.
		assigned := st.rec.Assigned
		if assigned == "" {
			assigned = e.stamp()
		}
		// Every assignment or release rewrites the handle, so guarding on
		// its revision also guards the counts we derived from the blocks.
		txn("rewrite handle "+h, datastore.Write(handleKey(h), datastore.MustJSON(handleRecord{Blocks: want, Assigned: assigned}), st.rev))
	}
	for _, h := range r.LeakedHandles {
		if err := e.ReleaseByHandle(ctx, h); err != nil {
			errs = append(errs, fmt.Errorf("releasing leaked handle %s: %w", h, err))
			continue
		}
		e.log.WithFields(logrus.Fields{"handle": h}).Info("released leaked addresses")
	}
	return errors.Join(errs...)
}
