package ipam

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Key layout, relative to the store prefix: every key IPAM owns is built
// from these (blockKey, affinityKey, handleKey, poolKey).
const (
	// PoolsPrefix holds the pool records (Pool): routing and policy follow
	// them too.
	PoolsPrefix = "pools/"
	// recordsPrefix holds the rest of IPAM's records (read whole by check).
	recordsPrefix  = "ipam/"
	blocksPrefix   = recordsPrefix + "blocks/"
	affinityPrefix = recordsPrefix + "affinity/"
	handlesPrefix  = recordsPrefix + "handles/"
	configKey      = recordsPrefix + "config"
	// poolsSerialKey is bumped by every pool creation and deletion. Pool
	// writes compare it, so two hosts adding overlapping pools at the same
	// time cannot both pass the overlap check.
	poolsSerialKey = recordsPrefix + "pools-serial"
)

func poolKey(p netip.Prefix) string  { return PoolsPrefix + escapeCIDR(p) }
func blockKey(p netip.Prefix) string { return blocksPrefix + escapeCIDR(p) }
func handleKey(id string) string     { return handlesPrefix + id }
func hostAffinityPrefix(host string) string {
	return affinityPrefix + host + "/"
}
func affinityKey(host string, p netip.Prefix) string {
	return hostAffinityPrefix(host) + escapeCIDR(p)
}

// parseAffinityKey splits ipam/affinity/<node>/<cidr> into node and block.
func parseAffinityKey(key string) (string, netip.Prefix, bool) {
	rest, ok := strings.CutPrefix(key, affinityPrefix)
	if !ok {
		return "", netip.Prefix{}, false
	}
	host, cidr, ok := strings.Cut(rest, "/")
	if !ok || host == "" {
		return "", netip.Prefix{}, false
	}
	p, ok := unescapeCIDR(cidr)
	return host, p, ok
}

// The affinity state routing acts on. Calico writes "pending" first and
// "pendingDeletion" before a release because its block and affinity are
// separate writes; here a claim creates the block and its confirmed
// affinity in one transaction and a release deletes both in one, so any
// other state is only ever read (from Calico or an older version):
// watchers ignore it and reloadHost confirms it when the block is the
// host's.
const stateConfirmed = "confirmed"

type affinityRecord struct {
	State string `json:"state"`
}

// affinityOf is the block.Affinity value for a host.
func affinityOf(host string) string { return hostAffinityTag + host }

// hostOfAffinity is the host an affinity names ("" when it names none).
func hostOfAffinity(affinity string) string {
	h, _ := strings.CutPrefix(affinity, hostAffinityTag)
	return h
}

// hostAffinityTag starts a block's affinity to a host.
const hostAffinityTag = "host:"

// handleRecord counts, per block CIDR, the addresses a handle holds there.
// It is written in the same transaction as the block(s) it describes.
//
// Assigned is when the handle's latest assignment committed (the value of
// AttrAssigned that Allocations report). It is kept here, written once per
// assignment, rather than in each holder's block attributes: every
// assignment rewrites its whole block, and a stamp per holder made those
// writes half again as large, which cut the rate of hosts assigning at
// once by a fifth (etcd's disk writes bound it). Assignments made before
// carry the stamp in their block attributes, still read (withStamp).
type handleRecord struct {
	Blocks   map[string]int `json:"blocks"`
	Assigned string         `json:"assigned,omitempty"`
}

func (h handleRecord) clone() handleRecord {
	return handleRecord{Blocks: maps.Clone(h.Blocks), Assigned: h.Assigned}
}

// withStamp is a with the assignment stamp of its handle record rec, when
// rec has one; otherwise a keeps the stamp its block attributes carry, if
// any (assignments made before the stamp moved to the handle).
func withStamp(a Allocation, rec handleRecord) Allocation {
	if rec.Assigned == "" {
		return a
	}
	if a.Attrs == nil {
		a.Attrs = map[string]string{}
	}
	a.Attrs[AttrAssigned] = rec.Assigned
	return a
}

func (h handleRecord) total() int {
	n := 0
	for _, c := range h.Blocks {
		n += c
	}
	return n
}

func (h *handleRecord) add(block netip.Prefix, n int) {
	if h.Blocks == nil {
		h.Blocks = map[string]int{}
	}
	k := block.String()
	h.Blocks[k] += n
	if h.Blocks[k] <= 0 {
		delete(h.Blocks, k)
	}
}

type attribute struct {
	HandleID  string            `json:"handleID"`
	Secondary map[string]string `json:"secondary,omitempty"`
	// encoded is the attribute as the block's record holds it, made once
	// when the attribute is made or read. Every assignment writes its
	// whole block: encoding every holder's map again at each write was a
	// large part of an assignment's CPU while each holder carried its own
	// stamp (as assignments made before handleRecord.Assigned still do).
	encoded []byte
}

// newAttribute is the attribute of handleID with attrs, encoded.
func newAttribute(handleID string, attrs map[string]string) attribute {
	a := attribute{HandleID: handleID, Secondary: attrs}
	a.encoded = appendAttributeJSON(nil, a)
	return a
}

// block is one allocation block, Calico's AllocationBlock: allocations[i] is
// the index into attributes of the holder of ordinal i, or null when free;
// unallocated lists the free ordinals in the order they are handed out.
// Released ordinals go to the end of that list (as in Calico), so an address
// is not reused straight away while its old holder may still be cleaning up.
type block struct {
	CIDR        string      `json:"cidr"`
	Affinity    string      `json:"affinity"`
	Allocations []*int      `json:"allocations"`
	Unallocated []int       `json:"unallocated"`
	Attributes  []attribute `json:"attributes"`
	// EmptiedAt is when the block last became empty; an affine block empty
	// for longer than the grace period is given back to the pool.
	EmptiedAt *time.Time `json:"emptiedAt,omitempty"`
	// Sequence grows with every write: a cheap way to see that a block
	// changed when comparing two reads.
	Sequence uint64 `json:"sequence"`

	prefix netip.Prefix
}

// newBlock is an empty block affine to host ("" for none). Every address is
// usable: like Calico, the network and broadcast addresses of a block are
// ordinary host addresses because blocks are routed, not attached to a link.
func newBlock(p netip.Prefix, host string) *block {
	n := blockAddrCount(p)
	b := &block{
		CIDR:        p.String(),
		Allocations: make([]*int, n),
		Unallocated: make([]int, n),
		Attributes:  []attribute{},
		prefix:      p,
	}
	if host != "" {
		b.Affinity = affinityOf(host)
	}
	for i := range b.Unallocated {
		b.Unallocated[i] = i
	}
	return b
}

func decodeBlock(key string, value []byte) (*block, error) {
	var b block
	if err := json.Unmarshal(value, &b); err != nil {
		return nil, fmt.Errorf("decoding block %s: %w", key, err)
	}
	p, err := netip.ParsePrefix(b.CIDR)
	if err != nil || len(b.Allocations) != blockAddrCount(p) {
		return nil, fmt.Errorf("block %s is corrupt: cidr %q with %d allocations", key, b.CIDR, len(b.Allocations))
	}
	b.prefix = p
	for i, a := range b.Attributes {
		b.Attributes[i] = newAttribute(a.HandleID, a.Secondary)
	}
	return &b, nil
}

// clone is a copy the caller may change. Attributes' Secondary maps are
// shared: nothing changes one in place (allocate and relabel make a new
// attribute), and copying them was most of an assignment's CPU while every
// assignment carried its own stamped attributes.
func (b *block) clone() *block {
	c := *b
	c.Allocations = make([]*int, len(b.Allocations))
	// One array behind every index instead of an allocation per address.
	idx := make([]int, len(b.Allocations))
	for i, a := range b.Allocations {
		if a != nil {
			idx[i] = *a
			c.Allocations[i] = &idx[i]
		}
	}
	// slices.Clone keeps an empty list empty rather than nil, so the copy
	// encodes to the same record ("[]", not "null").
	c.Unallocated = slices.Clone(b.Unallocated)
	c.Attributes = slices.Clone(b.Attributes)
	if c.Attributes == nil {
		c.Attributes = []attribute{}
	}
	if b.EmptiedAt != nil {
		t := *b.EmptiedAt
		c.EmptiedAt = &t
	}
	return &c
}

// host is the node the block is affine to, "" when none.
func (b *block) host() string {
	return hostOfAffinity(b.Affinity)
}

func (b *block) used() int {
	n := 0
	for _, a := range b.Allocations {
		if a != nil {
			n++
		}
	}
	return n
}

func (b *block) empty() bool { return b.used() == 0 }

// freeOrdinal is the next ordinal to hand out whose address is inside within
// (nil: anywhere).
func (b *block) freeOrdinal(within *netip.Prefix) (int, bool) {
	for _, o := range b.Unallocated {
		if within == nil || within.Contains(nthAddr(b.prefix, o)) {
			return o, true
		}
	}
	return 0, false
}

func (b *block) handleAt(ordinal int) (string, bool) {
	a := b.Allocations[ordinal]
	if a == nil || *a < 0 || *a >= len(b.Attributes) {
		return "", false
	}
	return b.Attributes[*a].HandleID, true
}

// heldBy tells whether ordinal is assigned to handleID.
func (b *block) heldBy(ordinal int, handleID string) bool {
	h, taken := b.handleAt(ordinal)
	return taken && h == handleID
}

// allocate takes ordinal for handleID. The caller checked it is free.
func (b *block) allocate(ordinal int, handleID string, attrs map[string]string) {
	idx := -1
	for i, a := range b.Attributes {
		if a.HandleID == handleID && maps.Equal(a.Secondary, attrs) {
			idx = i
			break
		}
	}
	if idx < 0 {
		b.Attributes = append(b.Attributes, newAttribute(handleID, maps.Clone(attrs)))
		idx = len(b.Attributes) - 1
	}
	b.Allocations[ordinal] = &idx
	for i, o := range b.Unallocated {
		if o == ordinal {
			b.Unallocated = append(b.Unallocated[:i], b.Unallocated[i+1:]...)
			break
		}
	}
	b.EmptiedAt = nil
	b.Sequence++
}

// release frees the given allocated ordinals and returns how many each handle
// lost. Attributes nobody references any more are dropped and the indexes
// renumbered, so blocks do not accumulate dead handles.
func (b *block) release(ordinals []int, now time.Time) map[string]int {
	lost := map[string]int{}
	for _, o := range ordinals {
		h, ok := b.handleAt(o)
		if !ok {
			continue
		}
		lost[h]++
		b.Allocations[o] = nil
		b.Unallocated = append(b.Unallocated, o)
	}
	b.compactAttributes()
	if b.empty() && b.EmptiedAt == nil {
		t := now.UTC()
		b.EmptiedAt = &t
	}
	b.Sequence++
	return lost
}

func (b *block) compactAttributes() {
	refs := make([]bool, len(b.Attributes))
	for _, a := range b.Allocations {
		if a != nil && *a >= 0 && *a < len(refs) {
			refs[*a] = true
		}
	}
	newIdx := make([]int, len(b.Attributes))
	kept := b.Attributes[:0:0]
	for i, a := range b.Attributes {
		if refs[i] {
			newIdx[i] = len(kept)
			kept = append(kept, a)
		}
	}
	for i, a := range b.Allocations {
		if a != nil && *a >= 0 && *a < len(newIdx) {
			v := newIdx[*a]
			b.Allocations[i] = &v
		}
	}
	b.Attributes = kept
}

// allocation describes the assigned ordinal o (which must be taken).
func (b *block) allocation(o int) Allocation {
	h, _ := b.handleAt(o)
	return Allocation{
		IP:       toIP(nthAddr(b.prefix, o)),
		HandleID: h,
		Attrs:    maps.Clone(b.Attributes[*b.Allocations[o]].Secondary),
		Block:    b.CIDR,
		Host:     b.host(),
	}
}

// relabel replaces the attributes of the assigned ordinal o, keeping its
// handle.
func (b *block) relabel(o int, attrs map[string]string) {
	h, _ := b.handleAt(o)
	b.allocate(o, h, attrs)
	b.compactAttributes()
}

// ordinalsOf lists the ordinals held by handleID.
func (b *block) ordinalsOf(handleID string) []int {
	var out []int
	for o := range b.Allocations {
		if h, ok := b.handleAt(o); ok && h == handleID {
			out = append(out, o)
		}
	}
	return out
}

// handleCounts is how many addresses each handle holds in the block.
func (b *block) handleCounts() map[string]int {
	out := map[string]int{}
	for o := range b.Allocations {
		if h, ok := b.handleAt(o); ok {
			out[h]++
		}
	}
	return out
}

func sortBlocks(bs []cachedBlock) {
	slices.SortFunc(bs, func(a, b cachedBlock) int { return comparePrefix(a.b.prefix, b.b.prefix) })
}
