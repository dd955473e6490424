package ipam

import (
	"context"
	"errors"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// ConfigChange changes some IPAM settings; nil fields stay as they are.
type ConfigChange struct {
	StrictAffinity     *bool
	AutoAllocateBlocks *bool
	MaxBlocksPerHost   *int
}

// Empty: the change changes nothing.
func (c ConfigChange) Empty() bool {
	return c.StrictAffinity == nil && c.AutoAllocateBlocks == nil && c.MaxBlocksPerHost == nil
}

// UpdateConfig applies ch to the IPAM configuration in one transaction
// guarded by the revision it read, so concurrent changes of different
// settings do not undo each other. It returns the configuration written.
func (e *Engine) UpdateConfig(ctx context.Context, ch ConfigChange) (Config, error) {
	if ch.MaxBlocksPerHost != nil && *ch.MaxBlocksPerHost < 0 {
		return Config{}, newError(ErrInvalidArgument, "maxBlocksPerHost must be 0 (unlimited) or positive, not %d", *ch.MaxBlocksPerHost)
	}
	var out Config
	err := e.store.Retry(ctx, func(ctx context.Context) error {
		c := DefaultConfig()
		rev, err := e.store.GetJSON(ctx, configKey, &c)
		if errors.Is(err, datastore.ErrNotFound) {
			c = DefaultConfig()
		} else if err != nil {
			return err
		}
		if ch.StrictAffinity != nil {
			c.StrictAffinity = *ch.StrictAffinity
		}
		if ch.AutoAllocateBlocks != nil {
			c.AutoAllocateBlocks = *ch.AutoAllocateBlocks
		}
		if ch.MaxBlocksPerHost != nil {
			c.MaxBlocksPerHost = *ch.MaxBlocksPerHost
		}
		out = c
		return e.store.Txn(ctx, datastore.Write(configKey, datastore.MustJSON(c), rev))
	})
	e.invalidateConfig()
	return out, err
}
