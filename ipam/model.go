package ipam

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// PoolInfo is a pool record decoded once (for the syncer's subscribers):
// the pool and its parsed prefix.
type PoolInfo struct {
	Pool
	Prefix netip.Prefix
}

// ComparePools orders pools as ListPools does.
func ComparePools(a, b *PoolInfo) int { return comparePoolPrefixes(a.Prefix, b.Prefix) }

// BlockAffinity is a host's claim on a block; only a confirmed one makes
// the block the host's.
type BlockAffinity struct {
	Host      string
	Block     netip.Prefix
	Confirmed bool
}

// HostAffinityPrefix is where host's block affinities live.
func HostAffinityPrefix(host string) string { return hostAffinityPrefix(host) }

func parsePoolRecord(key string, raw []byte) (any, error) {
	p, err := decodePool(datastore.KV{Key: key, Value: raw})
	if err != nil {
		return nil, err
	}
	return &PoolInfo{Pool: p.Pool, Prefix: p.prefix}, nil
}

func parseAffinityRecord(key string, raw []byte) (any, error) {
	host, block, ok := parseAffinityKey(key)
	if !ok {
		return nil, fmt.Errorf("not a block affinity key: %s", key)
	}
	var r affinityRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decoding affinity %s: %w", key, err)
	}
	return &BlockAffinity{Host: host, Block: block, Confirmed: r.State == stateConfirmed}, nil
}

// Kinds are the record kinds this package owns that the daemon follows.
func Kinds() []datastore.Kind {
	return []datastore.Kind{
		{Prefix: PoolsPrefix, Decode: parsePoolRecord},
		{Prefix: affinityPrefix, Decode: parseAffinityRecord},
	}
}
