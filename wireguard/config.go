package wireguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow"
)

// ErrInvalid marks a setting that cannot be applied (a usage error).
var ErrInvalid = errors.New("invalid WireGuard setting")

// Change is what `cluster set` changes; nil fields stay as they are.
type Change struct {
	Enabled *bool
	Mode    *string
	Port    *int
}

// ReadConfig reads the cluster setting (defaults when there is none)
// with the revision it was read at (0: none).
func ReadConfig(ctx context.Context, store follow.Store) (datastore.ClusterConfig, int64, error) {
	var cfg datastore.ClusterConfig
	kv, err := store.Get(ctx, datastore.ClusterConfigKey)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return cfg, 0, nil
	case err != nil:
		return cfg, 0, fmt.Errorf("reading the cluster configuration: %w", err)
	}
	if err := json.Unmarshal(kv.Value, &cfg); err != nil {
		return cfg, 0, fmt.Errorf("decoding %s: %w", datastore.ClusterConfigKey, err)
	}
	return cfg, kv.ModRevision, nil
}

// Configure applies c to the cluster setting in one guarded write (every
// daemon follows it at once) and returns the setting as written.
func Configure(ctx context.Context, store follow.Store, c Change) (datastore.ClusterConfig, error) {
	if c.Mode != nil {
		if _, err := ParseMode(*c.Mode); err != nil {
			return datastore.ClusterConfig{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if c.Port != nil && (*c.Port < 1 || *c.Port > 65535) {
		return datastore.ClusterConfig{}, fmt.Errorf("%w: WireGuard port %d: use 1-65535", ErrInvalid, *c.Port)
	}
	var out datastore.ClusterConfig
	err := store.Retry(ctx, func(ctx context.Context) error {
		cfg, rev, err := ReadConfig(ctx, store)
		if err != nil {
			return err
		}
		if c.Enabled != nil {
			cfg.WireGuard = *c.Enabled
		}
		if c.Mode != nil {
			cfg.WireGuardMode, _ = ParseMode(*c.Mode)
		}
		if c.Port != nil {
			cfg.WireGuardPort = *c.Port
		}
		out = cfg
		return store.Txn(ctx, datastore.Write(datastore.ClusterConfigKey, datastore.MustJSON(cfg), rev))
	})
	return out, err
}
