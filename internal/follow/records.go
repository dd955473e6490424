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
	ws := datastore.Values[datastore.WorkloadEndpoint](recs)
	out := make([]datastore.Endpoint, len(ws))
	for i, w := range ws {
		out[i] = w.Endpoint
	}
	return out
}

// Pools are the IP pools, as the syncer holds them, in ListPools' order.
func Pools(records datastore.Records) []ipam.Pool {
	ps := sortedPools(records)
	out := make([]ipam.Pool, len(ps))
	for i, p := range ps {
		out[i] = p.Pool
	}
	return out
}

// PoolPrefixes are the prefixes of every pool, disabled ones too, in
// ListPools' order.
func PoolPrefixes(records datastore.Records) []netip.Prefix {
	ps := sortedPools(records)
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = p.Prefix
	}
	return out
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
	out := make([]datastore.Node, 0, len(recs))
	for _, n := range datastore.Values[datastore.Node](recs) {
		out = append(out, *n)
	}
	return out
}
