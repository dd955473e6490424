package dockerapi

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/docker/docker/client"
	"github.com/sirupsen/logrus"
)

// EngineIdentity is this host's Docker engine ID (`docker info`'s ID),
// learned once Docker answers and then kept: it stays the same for a
// dockerd data root, while node names (the hostname by default) can repeat
// across cloned hosts. Liveness keys and endpoint records carry it, so that
// reconcile never touches what another host's daemon wrote.
type EngineIdentity struct {
	cli *client.Client
	id  atomic.Pointer[string]
}

// NewEngineIdentity asks the Docker daemon at host (see NewClient).
func NewEngineIdentity(host string) (*EngineIdentity, error) {
	cli, err := NewClient(host)
	if err != nil {
		return nil, err
	}
	return &EngineIdentity{cli: cli}, nil
}

// IdentityOf learns the engine ID through cli.
func IdentityOf(cli *client.Client) *EngineIdentity { return &EngineIdentity{cli: cli} }

// ID is the engine ID, "" while Docker has not answered yet.
func (e *EngineIdentity) ID() string {
	if p := e.id.Load(); p != nil {
		return *p
	}
	return ""
}

// Lookup returns the engine ID, asking Docker if it is not known yet.
func (e *EngineIdentity) Lookup(ctx context.Context) (string, error) {
	if id := e.ID(); id != "" {
		return id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	info, err := e.cli.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("asking Docker at %s for its engine ID: %w", e.cli.DaemonHost(), err)
	}
	if info.ID == "" {
		return "", fmt.Errorf("docker at %s reported no engine ID", e.cli.DaemonHost())
	}
	e.id.Store(&info.ID)
	return info.ID, nil
}

// Follow asks until Docker answers (the daemon may start before dockerd).
func (e *EngineIdentity) Follow(ctx context.Context, every time.Duration, log logrus.FieldLogger) {
	for {
		id, err := e.Lookup(ctx)
		if err == nil {
			log.WithField("engine", id).Info("learned the Docker engine ID")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
