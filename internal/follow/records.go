package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// UpdateNode applies change to node's record (a zero Node when there
// is none) and writes it, guarded by the revision read, retrying on
// conflicts; fields change leaves alone are kept. Nothing is written when
// the record is unchanged (or would be created empty).
//
// rev is the revision at which the record is as written: a reader of the
// syncer waits for it (WaitRevision) to see its own write.
func UpdateNode(ctx context.Context, store Store, node string, change func(*datastore.Node)) (written datastore.Node, changed bool, rev int64, err error) {
	err = store.Retry(ctx, func(ctx context.Context) error {
		key := datastore.NodeKey(node)
		var n datastore.Node
		rev = 0
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
		if rev, err = store.TxnRev(ctx, datastore.Write(key, datastore.MustJSON(want), rev)); err != nil {
			return err
		}
		changed = true
		return nil
	})
	return written, changed, rev, err
}

// Endpoints are every node's endpoint records (Node set from the key), as
// the syncer holds them.
func Endpoints(records datastore.Records) []datastore.Endpoint {
	recs, _ := records.List(datastore.EndpointsPrefix)
	return each(datastore.Values[datastore.WorkloadEndpoint](recs), func(w *datastore.WorkloadEndpoint) datastore.Endpoint { return w.Endpoint })
}

// Pools are the IP pools, as the syncer holds them, in ListPools' order.
func Pools(records datastore.Records) []ipam.Pool {
	return each(sortedPools(records), func(p *ipam.PoolInfo) ipam.Pool { return p.Pool })
}

// PoolPrefixes are the prefixes of every pool, disabled ones too, in
// ListPools' order.
func PoolPrefixes(records datastore.Records) []netip.Prefix {
	return each(sortedPools(records), func(p *ipam.PoolInfo) netip.Prefix { return p.Prefix })
}

func sortedPools(records datastore.Records) []*ipam.PoolInfo {
	recs, _ := records.List(ipam.PoolsPrefix)
	ps := datastore.Values[ipam.PoolInfo](recs)
	slices.SortFunc(ps, ipam.ComparePools)
	return ps
}

// BlockOwners maps every block confirmed affine to a host to that host.
func BlockOwners(records datastore.Records) map[netip.Prefix]string {
	recs, _ := records.List(ipam.AffinityWatchPrefix)
	out := make(map[netip.Prefix]string, len(recs))
	for _, a := range datastore.Values[ipam.BlockAffinity](recs) {
		if a.Confirmed {
			out[a.Block] = a.Host
		}
	}
	return out
}

// Nodes are the node records, as the syncer holds them.
func Nodes(records datastore.Records) []datastore.Node {
	recs, _ := records.List(datastore.NodesPrefix)
	return each(datastore.Values[datastore.Node](recs), func(n *datastore.Node) datastore.Node { return *n })
}

// each is f of every record value in vs, in order: the readers above
// differ only in the field they take.
func each[V, T any](vs []*V, f func(*V) T) []T {
	out := make([]T, len(vs))
	for i, v := range vs {
		out[i] = f(v)
	}
	return out
}
