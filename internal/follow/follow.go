// Package follow holds what the BGP agent (routing), the VXLAN manager
// (vxlan) and the WireGuard manager (wireguard) share of the datastore:
// following prefixes through the syncer, reading node and endpoint
// records from its memory, and changing a node's record.
package follow

import (
	"context"
	"fmt"
	"strings"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Store is the part of the datastore the managers write with
// (*datastore.Store has it).
type Store interface {
	Get(ctx context.Context, key string) (datastore.KV, error)
	List(ctx context.Context, prefix string) ([]datastore.KV, error)
	TxnRev(ctx context.Context, ops ...datastore.Op) (int64, error)
	Txn(ctx context.Context, ops ...datastore.Op) error
	Retry(ctx context.Context, fn func(ctx context.Context) error) error
}

// Prefixes signals dirty with each of the prefixes a batch of the
// syncer's changes touched, once per batch, until ctx ends. The first
// batch (what the datastore held when the subscription began) signals
// every prefix, so the consumer's first pass reads it all. The channel
// returned yields an error if the syncer stops while ctx is live: the
// caller hears of no change any more and must not go on as if it did.
func Prefixes(ctx context.Context, records datastore.Records, name string, prefixes []string, dirty chan<- string) <-chan error {
	gaveUp := make(chan error, 1)
	sub := records.Subscribe(ctx, name, prefixes...)
	go func() {
		for first := true; ; first = false {
			b, err := sub.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					gaveUp <- fmt.Errorf("following %s: %w", strings.Join(prefixes, ", "), err)
				}
				return
			}
			for _, p := range prefixes {
				if !first && !touches(b, p) {
					continue
				}
				select {
				case dirty <- p:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return gaveUp
}

func touches(b datastore.Batch, prefix string) bool {
	for _, c := range b.Changes {
		if strings.HasPrefix(c.Key, prefix) {
			return true
		}
	}
	return false
}
