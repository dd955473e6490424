package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/sirupsen/logrus"

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

// ErrHostBlocksEnded: a WatchHostBlocks stream closed while its context was
// live (the host name is invalid), so its consumer follows the host's
// blocks no more.
var ErrHostBlocksEnded = errors.New("the stream of the host's blocks ended")

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
		w := hostBlockWatch{
			e: e, host: host, prefix: hostAffinityPrefix(host),
			log: e.log.WithField("host", host), out: out, known: map[netip.Prefix]bool{},
		}
		w.run(ctx)
	}()
	return out
}

// hostBlockWatch is one WatchHostBlocks stream: known is what its consumer
// has been told the host owns.
type hostBlockWatch struct {
	e      *Engine
	host   string
	prefix string
	log    logrus.FieldLogger
	out    chan<- BlockEvent
	known  map[netip.Prefix]bool
}

// run lists the host's blocks, reports the difference with known, and
// follows the changes from there; when the watch breaks it lists again.
// It returns when ctx ends.
func (w *hostBlockWatch) run(ctx context.Context) {
	backoff := retry.New(retry.Standard())
	for ctx.Err() == nil {
		kvs, rev, err := w.e.store.ListWithRevision(ctx, w.prefix)
		if err != nil {
			w.log.WithError(err).Warn("listing host blocks failed, retrying")
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
		if !w.reportDifference(ctx, confirmedBlocks(kvs)) {
			return
		}
		if !w.followChanges(ctx, rev) {
			return
		}
	}
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

// reportDifference sends what the consumer must learn for known to become
// owned (sorted): removals first, lowest first, then additions; false when
// ctx ended.
func (w *hostBlockWatch) reportDifference(ctx context.Context, owned []netip.Prefix) bool {
	current := map[netip.Prefix]bool{}
	for _, p := range owned {
		current[p] = true
	}
	var gone []netip.Prefix
	for p := range w.known {
		if !current[p] {
			gone = append(gone, p)
		}
	}
	slices.SortFunc(gone, comparePrefix)
	for _, p := range gone {
		if !w.send(ctx, p, false) {
			return false
		}
		delete(w.known, p)
	}
	for _, p := range owned {
		if !w.known[p] {
			if !w.send(ctx, p, true) {
				return false
			}
			w.known[p] = true
		}
	}
	return true
}

// followChanges reports every change of ownership the etcd watch from rev
// shows; true when the watch broke or ended (list again), false when ctx
// ended while sending.
func (w *hostBlockWatch) followChanges(ctx context.Context, rev int64) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for ev := range w.e.store.Watch(wctx, w.prefix, rev) {
		if ev.Err != nil {
			w.log.WithError(ev.Err).Warn("watch on host blocks broke, re-listing")
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
		if owned != w.known[p] {
			if !w.send(ctx, p, owned) {
				return false
			}
			if owned {
				w.known[p] = true
			} else {
				delete(w.known, p)
			}
		}
	}
	return true
}
