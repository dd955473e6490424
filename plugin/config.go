package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/reconcile"
	"github.com/calico-cnm/calico-cnm/routing"
)

// Defaults a user sees in the README's configuration table.
const (
	DefaultStateDir           = "/var/lib/calico-cnm"
	DefaultSocketDir          = "/run/docker/plugins"
	DefaultNetworkSocket      = "calico.sock"
	DefaultIPAMSocket         = "calico-ipam.sock"
	DefaultReleaseGracePeriod = 30 * time.Second
	DefaultResyncInterval     = 30 * time.Second
)

// Config is everything the daemon needs, gathered from flags and env.
type Config struct {
	NodeName  string
	LogLevel  string
	StateDir  string
	SocketDir string
	// SingleSocket, when set, serves both APIs on one socket of that name:
	// the managed-plugin layout, where Docker talks to one socket per plugin.
	SingleSocket string
	Scope        string // "local" or "global"
	MTU          int
	// ProcSys is where per-interface sysctls are written ("" = /proc/sys).
	// The managed plugin sets it to a writable mount of the host's
	// /proc/sys, since runc mounts the plugin's own /proc/sys read-only.
	ProcSys string

	ReleaseGracePeriod time.Duration
	ResyncInterval     time.Duration

	Datastore datastore.Config

	// MetricsListen is the Prometheus /metrics and /healthz listener
	// ("" = off). It must be a loopback address.
	MetricsListen string

	// DockerHost is the Docker API the reconcile loop asks which endpoints
	// exist ("" = $DOCKER_HOST, else unix:///var/run/docker.sock).
	DockerHost string
	// ReconcileGrace is how long an endpoint record or address must look
	// stale before reconcile removes it (0 = reconcile.DefaultGrace).
	ReconcileGrace time.Duration

	BGP routing.Config

	// Failsafe are the ports host endpoint policy leaves open (nil:
	// policy.DefaultFailsafe).
	Failsafe *policy.Failsafe

	// Version is the calico-cnm version, published in the node's
	// heartbeat and the datastore's format record.
	Version string
}

// Env names, as the README documents them.
const (
	EnvEtcdEndpoints = "ETCD_ENDPOINTS"
	EnvEtcdCA        = "ETCD_CA_CERT_FILE"
	EnvEtcdCert      = "ETCD_CERT_FILE"
	EnvEtcdKey       = "ETCD_KEY_FILE"
	EnvEtcdPrefix    = "ETCD_PREFIX"
	EnvNodeName      = "NODENAME"
	EnvLogLevel      = "LOG_LEVEL"
	EnvStateDir      = "CALICO_CNM_STATE_DIR"
	EnvSocketDir     = "CALICO_CNM_SOCKET_DIR"
	EnvMetricsListen = "CALICO_CNM_METRICS_LISTEN"
	EnvDockerHost    = "DOCKER_HOST"
	EnvProcSys       = "CALICO_CNM_PROC_SYS"
)

// DefaultConfig reads the environment; flags override it afterwards.
func DefaultConfig(getenv func(string) string) Config {
	c := Config{
		NodeName:           getenv(EnvNodeName),
		LogLevel:           orDefault(getenv(EnvLogLevel), "info"),
		StateDir:           orDefault(getenv(EnvStateDir), DefaultStateDir),
		SocketDir:          orDefault(getenv(EnvSocketDir), DefaultSocketDir),
		ProcSys:            getenv(EnvProcSys),
		Scope:              "local",
		ReleaseGracePeriod: DefaultReleaseGracePeriod,
		ResyncInterval:     DefaultResyncInterval,
		MetricsListen:      getenv(EnvMetricsListen),
		DockerHost:         getenv(EnvDockerHost),
		ReconcileGrace:     reconcile.DefaultGrace,
		Datastore: datastore.Config{
			Endpoints:  SplitEndpoints(getenv(EnvEtcdEndpoints)),
			CACertFile: getenv(EnvEtcdCA),
			CertFile:   getenv(EnvEtcdCert),
			KeyFile:    getenv(EnvEtcdKey),
			Prefix:     orDefault(getenv(EnvEtcdPrefix), datastore.DefaultPrefix),
		},
	}
	return c
}

// Finish fills what depends on other fields and checks the result.
func (c *Config) Finish() error {
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("NODENAME is not set and the hostname is unreadable: %w", err)
		}
		c.NodeName = h
	}
	if strings.ContainsAny(c.NodeName, "/ ") {
		return fmt.Errorf("node name %q must not contain '/' or spaces", c.NodeName)
	}
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("LOG_LEVEL %q: use one of debug, info, warn, error", c.LogLevel)
	}
	switch c.Scope {
	case "local", "global":
	default:
		return fmt.Errorf("scope %q: use local or global", c.Scope)
	}
	if c.Scope == "global" && len(c.Datastore.Endpoints) == 0 {
		return fmt.Errorf("global scope needs a shared datastore: set ETCD_ENDPOINTS (the embedded member serves one host only)")
	}
	c.Datastore.Embedded = len(c.Datastore.Endpoints) == 0
	if c.Datastore.DataDir == "" {
		c.Datastore.DataDir = filepath.Join(c.StateDir, "etcd")
	}
	if c.Datastore.EmbeddedClientURL == "" {
		c.Datastore.EmbeddedClientURL = datastore.EmbeddedClientURL(c.StateDir)
	}
	if c.Datastore.EmbeddedPeerURL == "" {
		c.Datastore.EmbeddedPeerURL = datastore.EmbeddedPeerURL(c.StateDir)
	}
	if c.Datastore.EmbeddedName == "" {
		c.Datastore.EmbeddedName = c.NodeName
	}
	return nil
}

// SplitEndpoints parses ETCD_ENDPOINTS ("http://a:2379,http://b:2379").
func SplitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
