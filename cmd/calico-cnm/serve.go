package main

import (
	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/plugin"
)

func (a *app) serveCmd() *cobra.Command {
	cfg := plugin.DefaultConfig(a.getenv)
	var failsafeEnv func() error
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the plugin daemon (network driver calico, IPAM driver calico-ipam)",
		Long: `serve runs the network driver and the IPAM driver on the plugin sockets,
the dataplane, the BGP speaker (with --bgp) and, unless --etcd-endpoints names
an external cluster, an embedded etcd member. Every flag has an environment
variable (see the README's Configuration table).`,
		Example: `  calico-cnm serve
  calico-cnm serve --etcd-endpoints http://10.0.0.10:2379 --bgp --nodename host1
  ETCD_ENDPOINTS=http://10.0.0.10:2379 NODENAME=host1 calico-cnm serve --log-level debug`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := failsafeEnv(); err != nil {
				return err
			}
			g := a.global
			cfg.Datastore.Endpoints = plugin.SplitEndpoints(g.endpoints)
			cfg.Datastore.CACertFile, cfg.Datastore.CertFile, cfg.Datastore.KeyFile = g.ds.CACertFile, g.ds.CertFile, g.ds.KeyFile
			cfg.Datastore.Prefix = g.ds.Prefix
			cfg.Datastore.RequestTimeout = g.ds.RequestTimeout
			cfg.LogLevel = g.logLevel
			cfg.Version = Version
			// stdout, not stderr: dockerd files a managed plugin's stderr as
			// errors, whatever the line's own level.
			log := newLogger(a.stdout)
			applyRuntimeMemory(a.getenv, log)
			return plugin.Run(c.Context(), cfg, log)
		},
	}
	fs := c.Flags()
	fs.StringVar(&cfg.Datastore.EmbeddedClientURL, "etcd-listen-client", "", "embedded etcd client URL: unix://<path> or a loopback http:// URL (default unix://<state-dir>/etcd.sock, root only)")
	fs.StringVar(&cfg.Datastore.EmbeddedPeerURL, "etcd-listen-peer", "", "embedded etcd peer URL: unix://<path> or a loopback http:// URL (default unix://<state-dir>/etcd-peer.sock, root only)")
	fs.StringVar(&cfg.NodeName, "nodename", cfg.NodeName, "this host's name in the datastore (env NODENAME; default: hostname)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory; the embedded etcd keeps its data in <state-dir>/etcd (env CALICO_CNM_STATE_DIR)")
	fs.StringVar(&cfg.SocketDir, "socket-dir", cfg.SocketDir, "where the plugin sockets are created (env CALICO_CNM_SOCKET_DIR)")
	fs.StringVar(&cfg.SingleSocket, "single-socket", "", "serve both APIs on one socket of this name (managed plugin layout)")
	fs.StringVar(&cfg.Scope, "scope", cfg.Scope, "driver scope reported to Docker: local, or global (needs a shared etcd)")
	fs.IntVar(&cfg.MTU, "mtu", 0, "MTU of container interfaces (default 1500)")
	fs.StringVar(&cfg.ProcSys, "proc-sys", cfg.ProcSys, "where to write sysctls, if not /proc/sys (env CALICO_CNM_PROC_SYS; the managed plugin uses /host/proc/sys)")
	fs.DurationVar(&cfg.ReleaseGracePeriod, "block-release-grace", cfg.ReleaseGracePeriod, "how long an emptied block stays with this host before it is given back")
	fs.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "how often routes and blocks are re-checked against the datastore")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "serve Prometheus /metrics and /healthz on this loopback address, e.g. 127.0.0.1:9091 (env CALICO_CNM_METRICS_LISTEN; empty: off)")
	fs.StringVar(&cfg.DockerHost, "docker-host", cfg.DockerHost, "Docker API that reconcile asks which endpoints exist (env DOCKER_HOST; default unix:///var/run/docker.sock)")
	fs.DurationVar(&cfg.ReconcileGrace, "reconcile-grace", cfg.ReconcileGrace, "how long an endpoint or address must look stale (unknown to Docker) before reconcile removes it")
	addBGPFlags(fs, &cfg.BGP, a.getenv)
	failsafeEnv = addFailsafeFlags(fs, &cfg, a.getenv)
	return c
}
