// Package follow holds what the BGP agent (routing), the VXLAN manager
// (vxlan) and the WireGuard manager (wireguard) share of the datastore:
// following prefixes through the syncer, reading node and endpoint
// records from its memory, and changing a node's record.
package follow

import (
	"context"
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
// every prefix, so the consumer's first pass reads it all.
func Prefixes(ctx context.Context, records datastore.Records, name string, prefixes []string, dirty chan<- string) {
	sub := records.Subscribe(ctx, name, prefixes...)
	for first := true; ; first = false {
		b, err := sub.Next(ctx)
		if err != nil {
			return
		}
		for _, p := range prefixes {
			touched := first
			for _, c := range b.Changes {
				if touched {
					break
				}
				touched = strings.HasPrefix(c.Key, p)
			}
			if !touched {
				continue
			}
			select {
			case dirty <- p:
			case <-ctx.Done():
				return
			}
		}
	}
}
