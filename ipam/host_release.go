package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// HostBlocks is what ReleaseHostBlocks did with a host's affine blocks.
type HostBlocks struct {
	// Released blocks were empty: block and affinity are gone, the space
	// is back in the pool.
	Released []netip.Prefix
	// Orphaned blocks still hold addresses (borrowed by other hosts'
	// workloads): they lose their affinity, the borrowers keep advertising
	// their /32s, and the block goes as soon as its last address is
	// released.
	Orphaned []netip.Prefix
}

// ReleaseHostBlocks gives up every block affine to host, for a host that is
// gone for good (`node delete`); release the host's own addresses first.
// Unlike ReleaseEmptyBlocks there is no grace period. Each block is one
// transaction guarded by the block's and the affinity's revisions.
func (e *Engine) ReleaseHostBlocks(ctx context.Context, host string) (HostBlocks, error) {
	var out HostBlocks
	if err := validHost(host); err != nil {
		return out, err
	}
	affs, err := e.store.List(ctx, hostAffinityPrefix(host))
	if err != nil {
		return out, fmt.Errorf("listing affinities of host %s: %w", host, err)
	}
	for _, aff := range affs {
		_, p, ok := parseAffinityKey(aff.Key)
		if !ok {
			continue
		}
		const (
			staleAffinity = iota
			released
			orphaned
		)
		outcome := staleAffinity
		err := e.store.Retry(ctx, func(ctx context.Context) error {
			cur, err := e.store.Get(ctx, aff.Key)
			if errors.Is(err, datastore.ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			b, rev, exists, err := e.readBlock(ctx, p)
			if err != nil {
				return err
			}
			switch {
			case !exists || b.Affinity != affinityOf(host):
				// An affinity without its (or with somebody else's) block.
				outcome = staleAffinity
				return e.store.Txn(ctx, datastore.Delete(aff.Key, cur.ModRevision), datastore.Check(blockKey(p), rev))
			case b.empty():
				outcome = released
				return e.store.Txn(ctx, datastore.Delete(blockKey(p), rev), datastore.Delete(aff.Key, cur.ModRevision))
			default:
				outcome = orphaned
				b.Affinity = ""
				b.Sequence++
				return e.store.Txn(ctx, datastore.Update(blockKey(p), b.value(), rev), datastore.Delete(aff.Key, cur.ModRevision))
			}
		})
		if err != nil {
			return out, fmt.Errorf("releasing block %s of host %s: %w", p, host, err)
		}
		e.uncacheBlock(p)
		log := e.log.WithFields(logrus.Fields{"host": host, "block": p.String()})
		switch outcome {
		case orphaned:
			out.Orphaned = append(out.Orphaned, p)
			log.Info("block of a deleted host keeps its borrowed addresses, without affinity")
		case released:
			out.Released = append(out.Released, p)
			log.Info("block of a deleted host released back to the pool")
		}
	}
	return out, nil
}
