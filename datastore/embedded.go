package datastore

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/server/v3/embed"
)

// embeddedMember is a single-member etcd cluster running inside the daemon:
// one host needs no external datastore, yet everything above uses the same
// client code as with a real cluster.
type embeddedMember struct {
	etcd     *embed.Etcd
	stopping *atomic.Bool
}

func startEmbedded(ctx context.Context, cfg Config, log logrus.FieldLogger) (*embeddedMember, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("embedded etcd needs a data directory (state dir)")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating embedded etcd data dir: %w", err)
	}
	clientURL, err := url.Parse(cfg.EmbeddedClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", cfg.EmbeddedClientURL, err)
	}
	peerURL, err := url.Parse(cfg.EmbeddedPeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd peer URL %q: %w", cfg.EmbeddedPeerURL, err)
	}
	ec := embed.NewConfig()
	ec.Name = cfg.EmbeddedName
	ec.Dir = filepath.Clean(cfg.DataDir)
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	stopping := &atomic.Bool{}
	zl, err := newEtcdLogger(log, cfg.EmbeddedLogLevel, stopping)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd log level %q: %w", cfg.EmbeddedLogLevel, err)
	}
	ec.Logger = "zap"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zl)
	// Restarting on an existing data dir must rejoin, not bootstrap anew.
	if _, err := os.Stat(filepath.Join(ec.Dir, "member")); err == nil {
		ec.ClusterState = embed.ClusterStateFlagExisting
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("starting embedded etcd in %s (client %s): %w", ec.Dir, clientURL, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		stopping.Store(true)
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s did not become ready within 60s", ec.Dir)
	case <-ctx.Done():
		stopping.Store(true)
		e.Close()
		return nil, ctx.Err()
	}
	log.WithFields(logrus.Fields{"dir": ec.Dir, "client": clientURL.String()}).Info("embedded etcd member ready")
	return &embeddedMember{etcd: e, stopping: stopping}, nil
}

func (m *embeddedMember) close() {
	m.stopping.Store(true)
	m.etcd.Close()
}
