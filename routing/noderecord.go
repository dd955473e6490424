package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// updateNodeRecord applies change to node's record (a zero Node when there
// is none) and writes it, guarded by the revision read, retrying on
// conflicts; fields change leaves alone are kept. Nothing is written when
// the record is unchanged (or would be created empty).
func updateNodeRecord(ctx context.Context, store Store, node string, change func(*datastore.Node)) (written datastore.Node, changed bool, err error) {
	err = store.Retry(ctx, func(ctx context.Context) error {
		key := datastore.NodeKey(node)
		var n datastore.Node
		var rev int64
		kv, err := store.Get(ctx, key)
		switch {
		case err == nil:
			if err := json.Unmarshal(kv.Value, &n); err != nil {
				return fmt.Errorf("decoding %s: %w", key, err)
			}
			rev = kv.ModRevision
		case !errors.Is(err, datastore.ErrNotFound):
			return err
		}
		want := n
		change(&want)
		written, changed = want, false
		if want == n && (rev != 0 || want == (datastore.Node{})) {
			return nil
		}
		if err := store.Txn(ctx, datastore.Write(key, datastore.MustJSON(want), rev)); err != nil {
			return err
		}
		changed = true
		return nil
	})
	return written, changed, err
}
