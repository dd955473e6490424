package routing

import (
	"context"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// The datastore helpers the WireGuard manager (package wireguard) shares
// with BGP and VXLAN: one way to follow the datastore, to read node and
// endpoint records and to change this node's record.

// StoreRevision is the datastore's current revision (see followPrefix).
func StoreRevision(ctx context.Context, store Store, log logrus.FieldLogger) (int64, error) {
	return storeRevision(ctx, store, log)
}

// FollowPrefix signals dirty with prefix for every change under it after
// fromRev (see followPrefix).
func FollowPrefix(ctx context.Context, store Store, prefix string, fromRev int64, dirty chan<- string) {
	followPrefix(ctx, store, prefix, fromRev, dirty)
}

// UpdateNodeRecord changes node's record under a revision guard (see
// updateNodeRecord).
func UpdateNodeRecord(ctx context.Context, store Store, node string, change func(*datastore.Node)) (datastore.Node, bool, error) {
	return updateNodeRecord(ctx, store, node, change)
}

// ListNodes reads every node record.
func ListNodes(ctx context.Context, store Store) ([]datastore.Node, error) {
	return listNodes(ctx, store)
}

// ListEndpoints reads every node's endpoint records, Node set.
func ListEndpoints(ctx context.Context, store Store) ([]datastore.Endpoint, error) {
	return listEndpoints(ctx, store)
}
