// Package follow holds the datastore reads that the BGP agent (routing),
// the VXLAN manager (vxlan) and the WireGuard manager (wireguard) share:
// following a prefix from a revision, and reading or changing node and
// endpoint records. It is a stopgap until one datastore syncer feeds them
// all.
package follow

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/retry"
)

// Store is the part of the datastore the followers use (*datastore.Store
// has it).
type Store interface {
	Get(ctx context.Context, key string) (datastore.KV, error)
	List(ctx context.Context, prefix string) ([]datastore.KV, error)
	// ListWithRevision is List with the revision it read at.
	ListWithRevision(ctx context.Context, prefix string) ([]datastore.KV, int64, error)
	Txn(ctx context.Context, ops ...datastore.Op) error
	Retry(ctx context.Context, fn func(ctx context.Context) error) error
	Watch(ctx context.Context, prefix string, fromRev int64) <-chan datastore.Event
}

// Following the datastore. A watch from "now" (revision 0) is not live
// when Watch returns: etcd registers it when the request reaches the
// server, later. A change written between a first read and that moment
// was in neither: 32 daemons starting together, one of them read the node
// records before the last 7 nodes had registered, and its watch went live
// after they had; it rejected their blocks (reflected with a next hop it
// did not know as a node) until the 30 s resync. So the revision comes
// first (Revision), the reads after it, and the watches replay every
// change after it.

// Revision is the datastore's current revision, retried until it is
// read; an error only when ctx ends or the store refuses for good
// (retry.Permanent).
func Revision(ctx context.Context, store Store, log logrus.FieldLogger) (int64, error) {
	var rev int64
	err := retry.Until(ctx, retry.Standard(), 0, func(ctx context.Context) error {
		var err error
		rev, err = currentRevision(ctx, store)
		return err
	}, func(err error, next time.Duration) {
		log.WithError(err).Warnf("reading the datastore revision failed, retrying in %s", next.Round(time.Millisecond))
	})
	return rev, err
}

// currentRevision reads the datastore's revision (the header of a read;
// the key read is small and always the same).
func currentRevision(ctx context.Context, store Store) (int64, error) {
	_, rev, err := store.ListWithRevision(ctx, datastore.BGPConfigKey)
	return rev, err
}

// Prefix signals dirty with prefix for every change under it after
// revision fromRev: the caller takes fromRev before it first reads what
// prefix holds, so every change its read may have missed is signalled.
// After a break it takes a new revision, watches from there and signals
// once (whatever changed during the break is in the next read). It
// returns nil when ctx ends, and gives up (the error) only when the store
// refuses a new revision for good (retry.Permanent).
func Prefix(ctx context.Context, store Store, prefix string, fromRev int64, dirty chan<- string) error {
	signal := func() bool {
		select {
		case dirty <- prefix:
			return true
		case <-ctx.Done():
			return false
		}
	}
	backoff := retry.New(retry.Standard())
	rev := fromRev
	for ctx.Err() == nil {
		for ev := range store.Watch(ctx, prefix, rev) {
			if ev.Err != nil {
				break
			}
			backoff.Reset()
			if !signal() {
				return nil
			}
		}
		for {
			if !backoff.Wait(ctx) {
				return nil
			}
			var err error
			if rev, err = currentRevision(ctx, store); err == nil {
				break
			}
			if retry.IsPermanent(err) && ctx.Err() == nil {
				return fmt.Errorf("following %s: %w", prefix, err)
			}
		}
		if !signal() {
			return nil
		}
	}
	return nil
}

// Prefixes follows each of prefixes (Prefix) from fromRev into dirty. The
// channel returned yields the error of a follower that gave up: its
// caller no longer hears of changes there and must not go on as if it did.
func Prefixes(ctx context.Context, store Store, prefixes []string, fromRev int64, dirty chan<- string) <-chan error {
	gaveUp := make(chan error, len(prefixes))
	for _, prefix := range prefixes {
		go func() {
			if err := Prefix(ctx, store, prefix, fromRev, dirty); err != nil {
				gaveUp <- err
			}
		}()
	}
	return gaveUp
}
