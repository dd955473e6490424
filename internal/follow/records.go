package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// UpdateNode applies change to node's record (a zero Node when there
// is none) and writes it, guarded by the revision read, retrying on
// conflicts; fields change leaves alone are kept. Nothing is written when
// the record is unchanged (or would be created empty).
func UpdateNode(ctx context.Context, store Store, node string, change func(*datastore.Node)) (written datastore.Node, changed bool, err error) {
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

// ListEndpoints reads every node's endpoint records; the key says which
// node an endpoint is on.
func ListEndpoints(ctx context.Context, store Store) ([]datastore.Endpoint, error) {
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	var out []datastore.Endpoint
	for _, kv := range kvs {
		var ep datastore.Endpoint
		node, _, ok := datastore.EndpointNodeAndID(kv.Key)
		if ok && json.Unmarshal(kv.Value, &ep) == nil {
			ep.Node = node
			out = append(out, ep)
		}
	}
	return out, nil
}

// ListNodes reads every node record.
func ListNodes(ctx context.Context, store Store) ([]datastore.Node, error) {
	kvs, err := store.List(ctx, datastore.NodesPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var out []datastore.Node
	for _, kv := range kvs {
		var n datastore.Node
		if err := json.Unmarshal(kv.Value, &n); err == nil && n.Name != "" {
			out = append(out, n)
		}
	}
	return out, nil
}
