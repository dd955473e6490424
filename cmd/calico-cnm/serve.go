package main

import (
	"context"
	"flag"
	"strings"

	"github.com/calico-cnm/calico-cnm/plugin"
)

func (c *cli) serve(ctx context.Context, args []string) error {
	cfg := plugin.DefaultConfig(c.getenv)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	endpoints := fs.String("etcd-endpoints", strings.Join(cfg.Datastore.Endpoints, ","), "comma-separated etcd URLs (env ETCD_ENDPOINTS); empty: run an embedded etcd member")
	fs.StringVar(&cfg.Datastore.CACertFile, "etcd-ca-cert-file", cfg.Datastore.CACertFile, "CA certificate for etcd TLS (env ETCD_CA_CERT_FILE)")
	fs.StringVar(&cfg.Datastore.CertFile, "etcd-cert-file", cfg.Datastore.CertFile, "client certificate for etcd TLS (env ETCD_CERT_FILE)")
	fs.StringVar(&cfg.Datastore.KeyFile, "etcd-key-file", cfg.Datastore.KeyFile, "client key for etcd TLS (env ETCD_KEY_FILE)")
	fs.StringVar(&cfg.Datastore.Prefix, "etcd-prefix", cfg.Datastore.Prefix, "key prefix in etcd (env ETCD_PREFIX)")
	fs.DurationVar(&cfg.Datastore.RequestTimeout, "etcd-timeout", 0, "timeout of each datastore call (default 10s)")
	fs.StringVar(&cfg.Datastore.EmbeddedClientURL, "etcd-listen-client", "", "embedded etcd client URL: unix://<path> or a loopback http:// URL (default unix://<state-dir>/etcd.sock, root only)")
	fs.StringVar(&cfg.Datastore.EmbeddedPeerURL, "etcd-listen-peer", "", "embedded etcd peer URL (default http://127.0.0.1:2380)")
	fs.StringVar(&cfg.NodeName, "nodename", cfg.NodeName, "this host's name in the datastore (env NODENAME; default: hostname)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error (env LOG_LEVEL)")
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
	addBGPFlags(fs, &cfg.BGP, c.getenv)
	if err := fs.Parse(args); err != nil {
		return parseErr(err)
	}
	if fs.NArg() > 0 {
		return usagef("serve takes no arguments, got %q", fs.Args())
	}
	cfg.Datastore.Endpoints = plugin.SplitEndpoints(*endpoints)
	// stdout, not stderr: dockerd files a managed plugin's stderr as
	// errors, whatever the line's own level.
	return plugin.Run(ctx, cfg, newLogger(c.stdout))
}

// parseErr keeps -h a success and turns flag mistakes into usage errors.
func parseErr(err error) error {
	if err == flag.ErrHelp {
		return err
	}
	return usageError{err.Error()}
}
