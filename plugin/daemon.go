package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Run is `calico-cnm serve`: it opens the datastore, serves both plugin APIs
// and keeps the host's blackhole routes in step with its blocks until ctx is
// cancelled (SIGTERM).
func Run(ctx context.Context, cfg Config, log *logrus.Logger) error {
	if err := cfg.Finish(); err != nil {
		return err
	}
	if err := CheckMetricsListen(cfg.MetricsListen); err != nil {
		return err
	}
	lvl, _ := logrus.ParseLevel(cfg.LogLevel)
	log.SetLevel(lvl)
	entry := log.WithField("node", cfg.NodeName)

	if err := os.MkdirAll(cfg.SocketDir, 0o755); err != nil {
		return fmt.Errorf("creating socket dir %s: %w", cfg.SocketDir, err)
	}
	openCtx, cancelOpen := context.WithTimeout(ctx, 90*time.Second)
	store, err := datastore.Open(openCtx, cfg.Datastore, entry)
	cancelOpen()
	if err != nil {
		return fmt.Errorf("opening the datastore: %w", err)
	}
	defer store.Close()

	// Serve only while holding the node name: a second daemon with our
	// name (a cloned host) would remove this host's endpoints and free its
	// addresses, and we its.
	ident, err := NewEngineIdentity(cfg.DockerHost)
	if err != nil {
		return err
	}
	alive, lease, err := claimNodeName(ctx, cfg, store, ident, entry)
	if err != nil {
		if ctx.Err() != nil {
			entry.Info("stopped while waiting for the node name")
			return nil
		}
		return err
	}

	engine := ipam.New(store, ipam.Options{ReleaseGracePeriod: cfg.ReleaseGracePeriod, Log: entry})
	dp, err := dataplane.NewLinux("", entry, dataplane.WithProcSys(cfg.ProcSys))
	if err != nil {
		return fmt.Errorf("opening the host network namespace: %w", err)
	}
	defer dp.Close()

	vx, err := newVXLAN(cfg, store, engine, entry)
	if err != nil {
		return fmt.Errorf("starting VXLAN: %w", err)
	}
	pol, err := newPolicy(cfg, store, entry)
	if err != nil {
		return fmt.Errorf("starting network policy: %w", err)
	}
	policyStarted := false
	defer func() {
		if !policyStarted {
			pol.close()
		}
	}()
	portsMgr, portsNFT, err := newPorts(cfg, store, dp, entry)
	if err != nil {
		return err
	}
	defer portsNFT.Close()
	nd := driver.NewNetworkDriver(store, dp, cfg.NodeName, entry, driver.Options{Scope: cfg.Scope, MTU: cfg.MTU, IPAM: engine, Labels: pol.labels, Policy: pol.syncer, EngineID: ident.ID, WorkloadMTU: vx.mgr.WorkloadMTU, Ports: portsMgr})
	id := driver.NewIPAMDriver(engine, cfg.NodeName, entry)
	srv := NewServer(nd, id, entry)
	metrics := NewMetrics(engine, entry)
	srv.Observer = metrics.ObserveRequest
	health := NewHealth(store.Ping)
	health.Require("network policy", pol.syncer.Health)
	reconciler, err := newReconciler(cfg, store, engine, dp, metrics, entry)
	if err != nil {
		return err
	}
	var metricsListener net.Listener
	if cfg.MetricsListen != "" {
		if metricsListener, err = ListenMetrics(cfg.MetricsListen); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	var socketPaths []string
	serve := func(name string, implements ...string) {
		path := filepath.Join(cfg.SocketDir, name)
		socketPaths = append(socketPaths, path)
		wg.Add(1)
		go func() {
			defer wg.Done()
			entry.WithFields(logrus.Fields{"socket": path, "implements": implements}).Info("serving plugin API")
			if err := srv.ServeUnix(ctx, path, srv.Handler(implements...)); err != nil {
				errc <- fmt.Errorf("serving %s: %w", path, err)
			}
		}()
	}
	if cfg.SingleSocket != "" {
		serve(cfg.SingleSocket, "NetworkDriver", "IpamDriver")
	} else {
		serve(DefaultNetworkSocket, "NetworkDriver")
		serve(DefaultIPAMSocket, "IpamDriver")
	}
	if metricsListener != nil {
		entry.WithField("listen", metricsListener.Addr().String()).Info("serving /metrics and /healthz")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ServeMetrics(ctx, metricsListener, MetricsHandler(metrics, health)); err != nil {
				errc <- err
			}
		}()
	}
	// Reconcile once the sockets answer: cleaning up may take a while and
	// Docker must not wait for it (it may call us meanwhile).
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := waitServed(ctx, socketPaths); err != nil {
			return
		}
		health.SetServing(nil)
		reconciler.Run(ctx)
	}()

	wg.Add(1)
	go func() {
		defer wg.Done()
		syncBlackholes(ctx, engine, dp, cfg, entry)
	}()

	// The liveness lease tells `node list`/`node delete` this node is in
	// use; cancelling ctx revokes it before the datastore closes.
	wg.Add(2)
	go func() {
		defer wg.Done()
		store.KeepAliveFrom(ctx, alive, lease, datastore.DefaultAliveTTL, entry)
	}()
	go func() {
		defer wg.Done()
		ident.Follow(ctx, 5*time.Second, entry.WithField("component", "docker"))
	}()

	defer startVXLAN(ctx, cfg, vx, entry)()

	stopRouting, err := startRouting(ctx, cfg, store, engine, vx.mgr, metrics.Routing, health, entry)
	if err != nil {
		cancel()
		wg.Wait()
		return fmt.Errorf("starting BGP: %w", err)
	}
	defer stopRouting()

	defer startPorts(ctx, cfg, portsMgr)()

	policyStarted = true
	defer pol.start(ctx)()

	var runErr error
	select {
	case <-ctx.Done():
		entry.Info("shutting down")
	case runErr = <-errc:
		entry.WithError(runErr).Error("plugin server failed")
	}
	cancel()
	wg.Wait()
	return runErr
}

// claimNodeName marks the node alive, waiting while another live daemon
// holds its name (ClaimAlive logs who). The Docker engine ID, when Docker
// answers at once, names this host in that message; the wait for it is
// short, as a dockerd starting its managed plugins may not answer yet.
func claimNodeName(ctx context.Context, cfg Config, store *datastore.Store, ident *EngineIdentity, log logrus.FieldLogger) (datastore.Alive, clientv3.LeaseID, error) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	engineID, err := ident.Lookup(lctx)
	cancel()
	if err != nil {
		log.WithError(err).Info("Docker engine ID unknown at startup")
	}
	a := datastore.LocalAlive(cfg.NodeName, engineID)
	lease, err := store.ClaimAlive(ctx, a, datastore.DefaultAliveTTL, log)
	return a, lease, err
}

// blockRouter is the part of the dataplane that follows this host's blocks.
type blockRouter interface {
	EnsureBlackhole(ctx context.Context, block net.IPNet) error
	RemoveBlackhole(ctx context.Context, block net.IPNet) error
	ListBlackholes(ctx context.Context) ([]net.IPNet, error)
}

// syncBlackholes gives every block this host owns a blackhole route (so
// traffic to unassigned addresses of our block dies here rather than
// bouncing to a default route) and removes those of blocks we lost. The
// watch reacts at once; the periodic pass repairs anything the watch missed
// and gives back blocks that stayed empty past the grace period.
func syncBlackholes(ctx context.Context, engine *ipam.Engine, dp blockRouter, cfg Config, log logrus.FieldLogger) {
	events := engine.WatchHostBlocks(ctx, cfg.NodeName)
	ticker := time.NewTicker(cfg.ResyncInterval)
	defer ticker.Stop()
	resync := func() {
		if n, err := engine.ReleaseEmptyBlocks(ctx, cfg.NodeName); err != nil {
			log.WithError(err).Warn("releasing empty blocks")
		} else if n > 0 {
			log.WithField("blocks", n).Info("released empty blocks")
		}
		if err := ReconcileBlackholes(ctx, engine, dp, cfg.NodeName, log); err != nil && !errors.Is(err, context.Canceled) {
			log.WithError(err).Warn("reconciling blackhole routes")
		}
	}
	resync()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			bl := log.WithField("block", ev.Block.String())
			if ev.Added {
				if err := dp.EnsureBlackhole(ctx, ev.Block); err != nil {
					bl.WithError(err).Warn("adding blackhole route")
				} else {
					bl.Debug("blackhole route in place")
				}
			} else {
				if err := dp.RemoveBlackhole(ctx, ev.Block); err != nil {
					bl.WithError(err).Warn("removing blackhole route")
				} else {
					bl.Info("block released: blackhole route removed")
				}
			}
		case <-ticker.C:
			resync()
		}
	}
}

// ReconcileBlackholes makes the kernel's blackholes (ours, by protocol)
// match the blocks the datastore says this host owns.
func ReconcileBlackholes(ctx context.Context, engine *ipam.Engine, dp blockRouter, node string, log logrus.FieldLogger) error {
	want, err := engine.HostBlocks(ctx, node)
	if err != nil {
		return err
	}
	have, err := dp.ListBlackholes(ctx)
	if err != nil {
		return err
	}
	wanted := make(map[string]bool, len(want))
	for _, b := range want {
		wanted[b.String()] = true
		if err := dp.EnsureBlackhole(ctx, b); err != nil {
			return err
		}
	}
	for _, b := range have {
		if !wanted[b.String()] {
			log.WithField("block", b.String()).Info("removing blackhole of a block this host no longer owns")
			if err := dp.RemoveBlackhole(ctx, b); err != nil {
				return err
			}
		}
	}
	return nil
}
