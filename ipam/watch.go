package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/retry"
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

// WatchHostBlocks streams the host's blocks: first an Added event for every
// block it owns now, then one event per change (only confirmed affinities
// count as owned, so a claim in progress is reported once it is confirmed).
// When the etcd watch breaks it re-lists and reports the difference, so no
// change is lost. The channel is closed when ctx ends.
func (e *Engine) WatchHostBlocks(ctx context.Context, host string) <-chan BlockEvent {
	out := make(chan BlockEvent, 16)
	go func() {
		defer close(out)
		if err := validHost(host); err != nil {
			e.log.WithError(err).Error("not watching blocks")
			return
		}
		prefix := hostAffinityPrefix(host)
		log := e.log.WithField("host", host)
		known := map[netip.Prefix]bool{}
		send := func(p netip.Prefix, added bool) bool {
			select {
			case out <- BlockEvent{Block: toIPNet(p), Host: host, Added: added}:
				return true
			case <-ctx.Done():
				return false
			}
		}
		backoff := retry.New(retry.Standard())
		for ctx.Err() == nil {
			kvs, rev, err := e.store.ListWithRevision(ctx, prefix)
			if err != nil {
				log.WithError(err).Warn("listing host blocks failed, retrying")
				if !backoff.Wait(ctx) {
					return
				}
				continue
			}
			backoff.Reset()
			current := map[netip.Prefix]bool{}
			for _, p := range confirmedBlocks(kvs) {
				current[p] = true
			}
			// Report the difference with what the consumer already has.
			var gone []netip.Prefix
			for p := range known {
				if !current[p] {
					gone = append(gone, p)
				}
			}
			slices.SortFunc(gone, comparePrefix)
			for _, p := range gone {
				if !send(p, false) {
					return
				}
				delete(known, p)
			}
			for _, p := range confirmedBlocks(kvs) {
				if !known[p] {
					if !send(p, true) {
						return
					}
					known[p] = true
				}
			}
			wctx, cancel := context.WithCancel(ctx)
			for ev := range e.store.Watch(wctx, prefix, rev) {
				if ev.Err != nil {
					log.WithError(ev.Err).Warn("watch on host blocks broke, re-listing")
					break
				}
				_, p, ok := parseAffinityKey(ev.Key)
				if !ok {
					continue
				}
				owned := false
				if ev.Type == datastore.EventPut {
					_, owned = confirmedAffinity(ev.Key, ev.Value)
				}
				if owned != known[p] {
					if !send(p, owned) {
						cancel()
						return
					}
					if owned {
						known[p] = true
					} else {
						delete(known, p)
					}
				}
			}
			cancel()
		}
	}()
	return out
}
