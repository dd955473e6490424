package plugin

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/internal/dockerapi"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/ports"
	"github.com/calico-cnm/calico-cnm/reconcile"
	"github.com/calico-cnm/calico-cnm/vxlan"
	"github.com/calico-cnm/calico-cnm/wireguard"
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
	d := &daemon{cfg: cfg, log: log.WithField("node", cfg.NodeName)}

	if err := d.openDatastore(ctx); err != nil {
		return err
	}
	defer d.store.Close()
	// Before anything reads a record: a newer format would be misread.
	if _, err := ensureFormat(ctx, cfg, d.store, d.log); err != nil {
		return err
	}

	// Serve only while holding the node name: a second daemon with our
	// name (a cloned host) would remove this host's endpoints and free its
	// addresses, and we its.
	var err error
	if d.ident, err = dockerapi.NewEngineIdentity(cfg.DockerHost); err != nil {
		return err
	}
	alive, lease, err := claimNodeName(ctx, cfg, d.store, d.ident, d.log)
	if err != nil {
		if ctx.Err() != nil {
			d.log.Info("stopped while waiting for the node name")
			return nil
		}
		return err
	}

	if err := d.openDataplane(); err != nil {
		return err
	}
	defer d.dp.Close()
	defer d.nft.Close()
	closeSubsystems, err := d.prepareSubsystems()
	if err != nil {
		return err
	}
	defer closeSubsystems()
	if err := d.prepareAPIs(); err != nil {
		return err
	}

	// The services start in this order under one supervisor: the datastore
	// syncer (every other service follows the datastore through it), the plugin
	// sockets, /metrics and /healthz, the datastore format follower, the
	// heartbeat, the reconciler (once the sockets answer), the blackhole
	// routes, the liveness lease, Docker's engine ID, VXLAN, WireGuard, BGP
	// routing, published ports, bandwidth limits, network policy. A
	// failing one stops the daemon with its error (an optional one turns
	// /healthz red). They stop together; what they used is released
	// afterwards by the defers, the last made first.
	d.sup = newSupervisor(ctx, d.log)
	d.health.Require("daemon services", d.sup.Health)
	d.sup.Service("datastore syncer", d.syncer.Run)
	socketPaths := d.serveSockets()
	d.serveMetrics()
	d.startLoops(socketPaths, alive, lease)

	defer d.vx.start(d.sup)()
	defer d.wgd.start(d.sup)()
	closeRouting, err := startRouting(d.sup, cfg, d.store, d.syncer, d.engine, d.vx.mgr, d.metrics.Routing, d.health, d.log)
	if err != nil {
		_ = d.sup.Stop()
		return fmt.Errorf("starting BGP: %w", err)
	}
	defer closeRouting()
	startPorts(d.sup, cfg, d.portsMgr)
	startBandwidth(d.sup, d.bw)
	d.policyStarted = true
	defer d.pol.start(d.sup)()

	return d.serveUntilDone(ctx)
}

// daemon is what Run wires together: each step of its start-up is a
// method that fills in the parts it makes.
type daemon struct {
	cfg   Config
	log   logrus.FieldLogger
	store *datastore.Store
	// syncer is the one reader that follows the datastore; every
	// subsystem subscribes to it.
	syncer *datastore.Syncer
	ident  *dockerapi.EngineIdentity

	engine *ipam.Engine
	dp     *dataplane.Linux

	vx       *tunnel[*vxlan.Manager]
	wgd      *tunnel[*wireguard.Manager]
	pol      *policyRunner
	portsMgr *ports.Manager
	// nft is the one writer of every nftables table of the host's
	// (policy, published ports), shared by their managers.
	nft *nft.Conn
	bw  *bandwidth.Manager
	// policyStarted hands the policy's handles from closeSubsystems to
	// the stop func of pol.start.
	policyStarted bool

	srv             *Server
	metrics         *Metrics
	health          *Health
	reconciler      *reconcile.Reconciler
	metricsListener net.Listener // nil: no /metrics

	// sup runs every service of the daemon (see Run for the order).
	sup *supervisor
}

// openDatastore creates the socket directory and opens the datastore,
// waiting at most 90 s for it.
func (d *daemon) openDatastore(ctx context.Context) error {
	if err := os.MkdirAll(d.cfg.SocketDir, 0o755); err != nil {
		return fmt.Errorf("creating socket dir %s: %w", d.cfg.SocketDir, err)
	}
	openCtx, cancelOpen := context.WithTimeout(ctx, 90*time.Second)
	store, err := datastore.Open(openCtx, d.cfg.Datastore, d.log)
	cancelOpen()
	if err != nil {
		return fmt.Errorf("opening the datastore: %w", err)
	}
	d.store = store
	kinds := slices.Concat(datastore.Kinds(), ipam.Kinds(), api.Kinds())
	if d.syncer, err = datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: kinds, ResyncInterval: d.cfg.ResyncInterval, Log: d.log}); err != nil {
		_ = store.Close()
		return err
	}
	return nil
}

// openDataplane makes the address manager and opens the host's network
// namespace and its nftables; the caller closes d.dp and d.nft.
func (d *daemon) openDataplane() error {
	d.engine = ipam.New(d.store, ipam.Options{ReleaseGracePeriod: d.cfg.ReleaseGracePeriod, Log: d.log, Records: d.syncer,
		GuardedGate: d.store.RestoreGate(restoreHoldWait)})
	dp, err := dataplane.NewLinux("", d.log, dataplane.WithProcSys(d.cfg.ProcSys))
	if err != nil {
		return fmt.Errorf("opening the host network namespace: %w", err)
	}
	conn, err := nft.New("", d.log.WithField("component", "nftables"))
	if err != nil {
		dp.Close()
		return fmt.Errorf("opening the host's nftables: %w", err)
	}
	d.dp, d.nft = dp, conn
	return nil
}

// prepareSubsystems makes VXLAN, network policy and published ports, which
// Run starts only once the plugin APIs are served. closeSubsystems releases
// the bandwidth manager, then the policy's handles unless pol.start took
// them over.
func (d *daemon) prepareSubsystems() (closeSubsystems func(), err error) {
	if d.vx, err = newVXLAN(d.cfg, d.store, d.syncer, d.engine, d.log); err != nil {
		return nil, fmt.Errorf("starting VXLAN: %w", err)
	}
	if d.wgd, err = newWireGuard(d.cfg, d.store, d.syncer, d.engine, d.log); err != nil {
		return nil, fmt.Errorf("starting WireGuard: %w", err)
	}
	if d.pol, err = newPolicy(d.cfg, d.store, d.syncer, d.nft, d.log); err != nil {
		return nil, fmt.Errorf("starting network policy: %w", err)
	}
	closePolicy := func() {
		if !d.policyStarted {
			d.pol.close()
		}
	}
	d.portsMgr = newPorts(d.cfg, d.store, d.syncer, d.dp, d.nft, d.ident.ID, d.log)
	var closeBandwidth func()
	if d.bw, closeBandwidth, err = newBandwidth(d.cfg, d.syncer, d.ident.ID, d.log); err != nil {
		closePolicy()
		return nil, err
	}
	return func() {
		closeBandwidth()
		closePolicy()
	}, nil
}

// prepareAPIs makes the two drivers and the server of their plugin APIs,
// metrics and health, the reconciler, and the metrics listener.
func (d *daemon) prepareAPIs() error {
	cfg := d.cfg
	nd := driver.NewNetworkDriver(d.store, d.dp, cfg.NodeName, d.log, driver.Options{Scope: cfg.Scope, MTU: cfg.MTU, IPAM: d.engine, Labels: d.pol.labels, Policy: d.pol.syncer, EngineID: d.ident.ID, WorkloadMTU: d.wgd.mgr.WorkloadMTU(d.vx.mgr.WorkloadMTU), Ports: d.portsMgr, Shaper: d.bw})
	id := driver.NewIPAMDriver(d.engine, cfg.NodeName, d.log)
	d.srv = NewServer(nd, id, d.log)
	d.metrics = NewMetrics(d.engine, d.log)
	d.metrics.Registry.MustRegister(newPolicyCollector(d.pol.nft.Counters, d.log))
	d.srv.Observer = d.metrics.ObserveRequest
	d.health = NewHealth(d.store.Ping)
	d.health.Require("network policy", d.pol.syncer.Health)
	d.health.Require("VXLAN", d.vx.mgr.Health)
	d.health.Require("WireGuard", d.wgd.mgr.Health)
	d.metrics.Registry.MustRegister(d.wgd.mgr.Collector())
	d.health.Require("published ports", d.portsMgr.Health)
	var err error
	if d.reconciler, err = newReconciler(cfg, d.store, d.engine, d.dp, d.metrics, d.log); err != nil {
		return err
	}
	d.reconciler.Relabel = d.pol.labels.Relearn
	d.reconciler.Shaping = d.bw
	d.metrics.Registry.MustRegister(newBandwidthCollector(d.bw, d.log))
	if cfg.MetricsListen != "" {
		if d.metricsListener, err = ListenMetrics(cfg.MetricsListen); err != nil {
			return err
		}
	}
	return nil
}

// serveSockets serves the plugin APIs on their unix sockets (one for both
// with SingleSocket) until ctx is done, and returns the sockets' paths.
func (d *daemon) serveSockets() []string {
	var socketPaths []string
	serve := func(name string, implements ...string) {
		path := filepath.Join(d.cfg.SocketDir, name)
		socketPaths = append(socketPaths, path)
		d.sup.Service("plugin socket "+path, func(ctx context.Context) error {
			d.log.WithFields(logrus.Fields{"socket": path, "implements": implements}).Info("serving plugin API")
			return d.srv.ServeUnix(ctx, path, d.srv.Handler(implements...))
		})
	}
	if d.cfg.SingleSocket != "" {
		serve(d.cfg.SingleSocket, "NetworkDriver", "IpamDriver")
	} else {
		serve(DefaultNetworkSocket, "NetworkDriver")
		serve(DefaultIPAMSocket, "IpamDriver")
	}
	return socketPaths
}

// serveMetrics serves /metrics and /healthz, if configured, until ctx is
// done.
func (d *daemon) serveMetrics() {
	if d.metricsListener == nil {
		return
	}
	d.log.WithField("listen", d.metricsListener.Addr().String()).Info("serving /metrics and /healthz")
	d.sup.Service("/metrics and /healthz", func(ctx context.Context) error {
		return ServeMetrics(ctx, d.metricsListener, MetricsHandler(d.metrics, d.health))
	})
}

// startLoops runs under d.sup the follower of the datastore's format
// record, the heartbeat, the reconciler (once the sockets at socketPaths
// answer), the blackhole routes' sync, the liveness lease and the follower
// of Docker's engine ID.
func (d *daemon) startLoops(socketPaths []string, alive datastore.Alive, lease clientv3.LeaseID) {
	// A restore rewrites the format record last: reconcile at once, so
	// that addresses live containers use are reclaimed before anyone is
	// handed them again.
	kick := make(chan struct{}, 1)
	d.reconciler.Kick = kick
	d.sup.Service("datastore format", func(ctx context.Context) error {
		followFormat(ctx, subscribeFormat(ctx, d.syncer), kick, d.log)
		return ctx.Err()
	})
	d.sup.Service("heartbeat", func(ctx context.Context) error {
		heartbeat(ctx, d.cfg, d.store, d.log)
		return ctx.Err()
	})
	// Reconcile once the sockets answer: cleaning up may take a while and
	// Docker must not wait for it (it may call us meanwhile).
	d.sup.Service("reconcile", func(ctx context.Context) error {
		if err := waitServed(ctx, socketPaths); err != nil {
			return err
		}
		d.health.SetServing(nil)
		d.reconciler.Run(ctx)
		return ctx.Err()
	})
	d.sup.Service("blackhole routes", func(ctx context.Context) error {
		return syncBlackholes(ctx, d.engine, d.dp, d.cfg, d.log)
	})
	// The liveness lease tells `node list`/`node delete` this node is in
	// use; cancelling ctx revokes it before the datastore closes.
	d.sup.Service("liveness lease", func(ctx context.Context) error {
		d.store.KeepAliveFrom(ctx, alive, lease, datastore.DefaultAliveTTL, d.log)
		return ctx.Err()
	})
	d.sup.Task("Docker engine ID", func(ctx context.Context) error {
		d.ident.Follow(ctx, 5*time.Second, d.log.WithField("component", "docker"))
		return nil
	})
}

// serveUntilDone waits for ctx to end or a service to fail, then stops
// every service and waits for them: the failure is Run's error.
func (d *daemon) serveUntilDone(ctx context.Context) error {
	<-d.sup.Done()
	if ctx.Err() != nil {
		d.log.Info("shutting down")
	}
	err := d.sup.Stop()
	if err != nil {
		d.log.WithError(err).Error("a service failed: the daemon stops")
	}
	return err
}

// claimNodeName marks the node alive, waiting while another live daemon
// holds its name (ClaimAlive logs who). The Docker engine ID, when Docker
// answers at once, names this host in that message; the wait for it is
// short, as a dockerd starting its managed plugins may not answer yet.
func claimNodeName(ctx context.Context, cfg Config, store *datastore.Store, ident *dockerapi.EngineIdentity, log logrus.FieldLogger) (datastore.Alive, clientv3.LeaseID, error) {
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
func syncBlackholes(ctx context.Context, engine *ipam.Engine, dp blockRouter, cfg Config, log logrus.FieldLogger) error {
	events := engine.WatchHostBlocks(ctx, cfg.NodeName)
	ticker := time.NewTicker(cfg.ResyncInterval)
	defer ticker.Stop()
	// A pass cut short by the daemon's stop is not a fault: the error then
	// says only that the context ended (as the datastore's own error, not
	// always context.Canceled), so the context is asked instead.
	resync := func() {
		if n, err := engine.ReleaseEmptyBlocks(ctx, cfg.NodeName); err != nil {
			if ctx.Err() == nil {
				log.WithError(err).Warn("releasing empty blocks")
			}
		} else if n > 0 {
			log.WithField("blocks", n).Info("released empty blocks")
		}
		if err := ReconcileBlackholes(ctx, engine, dp, cfg.NodeName, log); err != nil && ctx.Err() == nil {
			log.WithError(err).Warn("reconciling blackhole routes")
		}
	}
	resync()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				return cmp.Or(ctx.Err(), ipam.ErrHostBlocksEnded)
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
