package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// BlockEvent says that Host gained (Added) or lost a block. Routing adds or
// removes the blackhole route and the BGP advertisement for it.
type BlockEvent struct {
	Block net.IPNet
	Host  string
	Added bool
}

// HostBlocks lists the blocks confirmed affine to host, lowest first.
func (e *Engine) HostBlocks(ctx context.Context, host string) ([]net.IPNet, error) {
	if err := validHost(host); err != nil {
		return nil, err
	}
	kvs, err := e.store.List(ctx, hostAffinityPrefix(host))
	if err != nil {
		return nil, fmt.Errorf("listing blocks of host %s: %w", host, err)
	}
	set := confirmedBlocks(kvs)
	out := make([]net.IPNet, len(set))
	for i, p := range set {
		out[i] = toIPNet(p)
	}
	return out, nil
}

func confirmedBlocks(kvs []datastore.KV) []netip.Prefix {
	var out []netip.Prefix
	for _, kv := range kvs {
		if p, ok := confirmedAffinity(kv.Key, kv.Value); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func confirmedAffinity(key string, value []byte) (netip.Prefix, bool) {
	_, p, ok := parseAffinityKey(key)
	if !ok {
		return netip.Prefix{}, false
	}
	var r affinityRecord
	if err := json.Unmarshal(value, &r); err != nil || r.State != stateConfirmed {
		return netip.Prefix{}, false
	}
	return p, true
}

// ErrHostBlocksEnded: a WatchHostBlocks stream closed while its context was
// live (the host name is invalid), so its consumer follows the host's
// blocks no more.
var ErrHostBlocksEnded = errors.New("the stream of the host's blocks ended")

// WatchHostBlocks streams the host's blocks: first an Added event for every
// block it owns now, then one event per change (only confirmed affinities
// count as owned, so a claim in progress is reported once it is confirmed).
// The changes come from the datastore syncer (Options.Records; without
// one, a syncer of the affinities of its own), which handles broken
// watches. The channel is closed when ctx ends.
func (e *Engine) WatchHostBlocks(ctx context.Context, host string) <-chan BlockEvent {
	out := make(chan BlockEvent, 16)
	if err := validHost(host); err != nil {
		e.log.WithError(err).Error("not watching blocks")
		close(out)
		return out
	}
	records := e.records
	if records == nil {
		s, err := datastore.NewSyncer(e.store, datastore.SyncerConfig{Kinds: Kinds(), Log: e.log})
		if err != nil {
			e.log.WithError(err).Error("not watching blocks")
			close(out)
			return out
		}
		go func() { _ = s.Run(ctx) }()
		records = s
	}
	sub := records.Subscribe(ctx, "blocks of "+host, hostAffinityPrefix(host))
	go func() {
		defer close(out)
		w := hostBlockWatch{host: host, out: out, known: map[netip.Prefix]bool{}}
		for {
			b, err := sub.Next(ctx)
			if err != nil || !w.report(ctx, b) {
				return
			}
		}
	}()
	return out
}

// hostBlockWatch is one WatchHostBlocks stream: known is what its consumer
// has been told the host owns.
type hostBlockWatch struct {
	host  string
	out   chan<- BlockEvent
	known map[netip.Prefix]bool
}

// report sends what the batch changes in the host's blocks: removals
// first, then additions, each lowest first; false when ctx ended.
func (w *hostBlockWatch) report(ctx context.Context, b datastore.Batch) bool {
	var gone, added []netip.Prefix
	for _, c := range b.Changes {
		var block netip.Prefix
		owned := false
		for _, r := range []*datastore.Synced{c.New, c.Old} {
			if r == nil {
				continue
			}
			if a, ok := r.Value.(*BlockAffinity); ok {
				block = a.Block
				owned = owned || (r == c.New && a.Confirmed)
			}
		}
		if !block.IsValid() || owned == w.known[block] {
			continue
		}
		if owned {
			added = append(added, block)
		} else {
			gone = append(gone, block)
		}
	}
	slices.SortFunc(gone, comparePrefix)
	slices.SortFunc(added, comparePrefix)
	for _, p := range gone {
		if !w.send(ctx, p, false) {
			return false
		}
		delete(w.known, p)
	}
	for _, p := range added {
		if !w.send(ctx, p, true) {
			return false
		}
		w.known[p] = true
	}
	return true
}

// send tells the consumer that the host gained or lost p; false when ctx
// ended first.
func (w *hostBlockWatch) send(ctx context.Context, p netip.Prefix, added bool) bool {
	select {
	case w.out <- BlockEvent{Block: toIPNet(p), Host: w.host, Added: added}:
		return true
	case <-ctx.Done():
		return false
	}
}
