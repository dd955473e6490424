package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"
)

// HostOptions tune a simulated Docker host.
type HostOptions struct {
	// Bridge keeps Docker's default bridge network (docker0, NAT) - for the
	// bridge-driver baseline. dockerd then manages iptables, inside the host's
	// own network namespace only. Default: --bridge none --iptables=false.
	Bridge bool
	// NoDockerd creates only the network namespace (and fabric wiring).
	NoDockerd bool
	// DockerdDebug runs dockerd with --debug (every plugin call is logged).
	DockerdDebug bool
	// DockerdArgs are appended to the dockerd command line.
	DockerdArgs []string
	// LiveRestore runs dockerd with --live-restore, as a real host would:
	// every incarnation shares one mount namespace (with /run/docker,
	// /run/containerd and the containers' netns bind mounts), kept by a
	// holder process, and StopDockerd leaves containerd's shims and the
	// containers running.
	LiveRestore bool
}

// Host is one simulated Docker host: a network namespace with its own dockerd
// (own data root, exec root, containerd, and /run/docker/plugins) and the
// plugin processes started on it. All of it is removed by t.Cleanup.
type Host struct {
	Name       string // logical name, the default --nodename
	Netns      string // network namespace name, cnme2e-XXXXXX
	NetnsPath  string // /var/run/netns/<Netns>
	Dir        string // per-host temp dir (logs, data root, sockets)
	PluginDir  string // the directory dockerd sees as /run/docker/plugins
	StateDir   string // default --state-dir of the plugin
	DockerSock string // dockerd's API socket (path; the CLI gets unix://...)

	// Fabric wiring (nil / empty for a standalone host).
	IP       net.IP     // the host's address on the fabric (on its eth0)
	Subnet   *net.IPNet // the fabric subnet
	Gateway  net.IP     // the bridge address in the root namespace
	RootVeth string     // root-namespace end of the host's veth
	IP6      net.IP     // the host's IPv6 address on the fabric (Fabric.EnableIPv6)

	opts    HostOptions
	t       testing.TB
	netIno  uint64
	dockerd *Process
	// mntHolder keeps the LiveRestore host's mount namespace alive between
	// dockerd incarnations.
	mntHolder *Process

	apiMu sync.Mutex
	api   *client.Client // of dockerAPI, made at its first use

	mu       sync.Mutex
	mntInos  []uint64   // mount namespaces of every dockerd incarnation
	procs    []*Process // plugins and other processes started in the netns
	nplugins int
	untracks []func()
}

// NewHost creates a standalone host (no fabric): a fresh network namespace
// with only lo (up), and - unless opts.NoDockerd - a running dockerd.
func NewHost(t testing.TB, name string, opts HostOptions) *Host {
	t.Helper()
	h := newHostNetns(t, name, opts)
	h.finish(t)
	return h
}

// newHostNetns creates the host's dir and netns and registers the cleanup.
func newHostNetns(t testing.TB, name string, opts HostOptions) *Host {
	t.Helper()
	RequirePrereqs(t)
	id := randHex(6)
	h := &Host{Name: name, Netns: NamePrefix + "-" + id, opts: opts, t: t}
	if h.Name == "" {
		h.Name = h.Netns
	}
	h.NetnsPath = netnsPath(h.Netns)
	dir, err := os.MkdirTemp("", NamePrefix+"-"+id+"-")
	if err != nil {
		t.Fatalf("harness: temp dir: %v", err)
	}
	h.Dir = dir
	h.untracks = append(h.untracks, track(resource{Kind: "dir", Name: dir}))
	h.PluginDir = filepath.Join(dir, "plugins")
	h.StateDir = filepath.Join(dir, "state")
	h.DockerSock = filepath.Join(dir, "docker.sock")
	for _, d := range []string{h.PluginDir, h.StateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	// Registered before anything else exists, so that a failure half-way
	// through is cleaned up too.
	t.Cleanup(h.cleanup)

	if _, err := runCmd(nil, nil, "ip", "netns", "add", h.Netns); err != nil {
		t.Fatalf("harness: creating network namespace: %v", err)
	}
	h.untracks = append(h.untracks, track(resource{Kind: "netns", Name: h.Netns}))
	h.netIno = fileInode(h.NetnsPath)
	if _, err := runCmd(nil, nil, "ip", "-n", h.Netns, "link", "set", "lo", "up"); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return h
}

// finish starts dockerd unless NoDockerd.
func (h *Host) finish(t testing.TB) {
	t.Helper()
	if !h.opts.NoDockerd {
		h.StartDockerd(t)
	}
	t.Logf("harness: host %s ready: netns %s, dir %s%s", h.Name, h.Netns, h.Dir, h.describeIP())
}

func (h *Host) describeIP() string {
	if h.IP == nil {
		return ""
	}
	return fmt.Sprintf(", eth0 %s/%d via %s", h.IP, prefixLen(h.Subnet), h.Gateway)
}

func netnsPath(name string) string { return "/var/run/netns/" + name }

// ---------------------------------------------------------------- dockerd

// The shell run inside a private mount namespace, in the host's network
// namespace, before exec'ing dockerd:
//   - /run/docker and /run/containerd get private tmpfs: dockerd does not see
//     (nor use!) a system containerd at /run/containerd/containerd.sock, nor
//     other plugins' sockets, and the shim sockets stay private;
//   - PLUGDIR is bind-mounted on /run/docker/plugins, where dockerd looks for
//     plugin sockets (the plugin writes into PLUGDIR from the root mount ns);
//   - the plugin spec dirs get empty tmpfs (no foreign .spec/.json plugins);
//   - /run/netns is unmounted: otherwise this mount namespace would pin every
//     other host's network namespace (copied bind mounts) until dockerd exits.
const dockerdShell = `#!/bin/sh
# run by the e2e harness: nsenter --net=NETNS unshare --mount --propagation private sh THIS dockerd ARGS...
set -e
mkdir -p /run/docker /run/containerd
mount -t tmpfs -o mode=0755 tmpfs /run/docker
mount -t tmpfs -o mode=0711 tmpfs /run/containerd
mkdir -p /run/docker/plugins
mount --bind "$PLUGDIR" /run/docker/plugins
for d in /etc/docker/plugins /usr/lib/docker/plugins; do
	if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d"; fi
done
mps=$(while read -r _ _ _ _ mp _; do case "$mp" in /run/netns/*|/var/run/netns/*) echo "$mp";; esac; done </proc/self/mountinfo)
for mp in $mps; do umount -l "$mp" 2>/dev/null || true; done
umount -l /run/netns 2>/dev/null || true
umount -l /var/run/netns 2>/dev/null || true
exec "$@"
`

func (h *Host) dockerdArgs() []string {
	args := []string{DockerdPath,
		"--config-file", filepath.Join(h.Dir, "daemon.json"),
		"--data-root", filepath.Join(h.Dir, "root"),
		"--exec-root", filepath.Join(h.Dir, "exec"),
		"--host", "unix://" + h.DockerSock,
		"--pidfile", filepath.Join(h.Dir, "docker.pid"),
		"--storage-driver", "vfs",
		"--userland-proxy=false",
		// The same driver everywhere: 20.10 picks systemd on cgroup v2 hosts
		// that run systemd, which would involve D-Bus.
		"--exec-opt", "native.cgroupdriver=cgroupfs",
	}
	if !h.opts.Bridge {
		args = append(args, "--bridge", "none", "--iptables=false", "--ip6tables=false")
	}
	if h.opts.DockerdDebug {
		args = append(args, "--debug")
	}
	if h.opts.LiveRestore {
		args = append(args, "--live-restore")
	}
	return append(args, h.opts.DockerdArgs...)
}

// StartDockerd starts the host's dockerd (NewHost does it unless NoDockerd)
// and waits until the API answers.
func (h *Host) StartDockerd(t testing.TB) {
	t.Helper()
	if h.dockerd == nil {
		if err := os.WriteFile(filepath.Join(h.Dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
			t.Fatalf("harness: %v", err)
		}
		wrapper := filepath.Join(h.Dir, "dockerd-wrapper.sh")
		if err := os.WriteFile(wrapper, []byte(dockerdShell), 0o755); err != nil {
			t.Fatalf("harness: %v", err)
		}
		env := append(baseEnv(), "PLUGDIR="+h.PluginDir)
		inPrivateMounts := []string{"nsenter", "--net=" + h.NetnsPath, "--",
			"unshare", "--mount", "--propagation", "private", "--",
			"sh", wrapper}
		argv := append(inPrivateMounts, h.dockerdArgs()...)
		if h.opts.LiveRestore {
			h.startMountHolder(t, inPrivateMounts, env)
			argv = append([]string{"nsenter", "--net=" + h.NetnsPath,
				fmt.Sprintf("--mount=/proc/%d/ns/mnt", h.mntHolder.Pid()), "--"}, h.dockerdArgs()...)
		}
		h.dockerd = newProcess("dockerd", filepath.Join(h.Dir, "dockerd.log"), argv, env, h.dockerdReady)
		h.dockerd.dumpedOnFailure = true
		h.dockerd.onStarted = func(p *Process) { h.recordMountNamespace(p) }
	}
	start := time.Now()
	h.dockerd.start(t, DockerdStartTimeout)
	t.Logf("harness: dockerd of %s (pid %d) answered after %s", h.Name, h.dockerd.Pid(), time.Since(start).Round(time.Millisecond))
}

// startMountHolder sets up the private mounts once, in a process that then
// only sleeps: while it lives, so does the mount namespace every dockerd
// incarnation of a LiveRestore host enters.
func (h *Host) startMountHolder(t testing.TB, inPrivateMounts, env []string) {
	t.Helper()
	var holder *Process
	holderReady := func(context.Context) error {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Pid()))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(comm)) != "sleep" {
			return fmt.Errorf("mounts not set up yet (%s)", strings.TrimSpace(string(comm)))
		}
		return nil
	}
	holder = newProcess("mount-namespace-holder", filepath.Join(h.Dir, "mntns-holder.log"),
		append(append([]string(nil), inPrivateMounts...), "sleep", "infinity"), env, holderReady)
	holder.dumpedOnFailure = true
	holder.onStarted = func(p *Process) { h.recordMountNamespace(p) }
	holder.start(t, 30*time.Second)
	h.mntHolder = holder
}

// recordMountNamespace remembers p's mount namespace, swept at cleanup.
func (h *Host) recordMountNamespace(p *Process) {
	ino := nsInode(p.Pid(), "mnt")
	if ino == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, known := range h.mntInos {
		if known == ino {
			return
		}
	}
	h.mntInos = append(h.mntInos, ino)
}

// dockerdReady: dockerd's API answers GET /version on its socket, as for
// `docker version`. Asked here rather than through the docker CLI: a
// dockerd takes seconds to answer on a busy machine, polled every 150 ms,
// and each run of the CLI costs about 0.1 s of CPU.
func (h *Host) dockerdReady(ctx context.Context) error {
	c := unixSocketClient(h.DockerSock)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/version", nil)
	if err != nil {
		return err
	}
	res, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("dockerd API at %s: %w", h.DockerSock, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var v struct{ Version string }
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &v) != nil || v.Version == "" {
		return fmt.Errorf("dockerd API at %s: GET /version: HTTP %d: %s", h.DockerSock, res.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// StopDockerd stops dockerd (SIGTERM; SIGKILL after StopTimeout, which fails
// the test) and kills what it left in its mount namespace (containerd, shims)
// - except on a LiveRestore host, whose containers keep running.
func (h *Host) StopDockerd(t testing.TB) {
	t.Helper()
	if h.dockerd == nil {
		return
	}
	h.dockerd.Stop(t)
	if !h.opts.LiveRestore {
		h.killLeftovers(false)
	}
}

// RestartDockerd stops and starts dockerd again (same data root: containers,
// networks and images survive; running containers are stopped by dockerd,
// unless LiveRestore).
func (h *Host) RestartDockerd(t testing.TB) {
	t.Helper()
	h.StopDockerd(t)
	h.StartDockerd(t)
}

// Dockerd is the dockerd process (nil with NoDockerd).
func (h *Host) Dockerd() *Process { return h.dockerd }

// DockerdLog is the path of dockerd's log.
func (h *Host) DockerdLog() string { return filepath.Join(h.Dir, "dockerd.log") }

// ---------------------------------------------------------------- docker CLI

var (
	dockerCfgOnce sync.Once
	dockerCfgDir  string
)

// dockerEnv: the docker CLI with an empty private config dir.
func dockerEnv() []string {
	dockerCfgOnce.Do(func() {
		d, err := os.MkdirTemp("", NamePrefix+"-dockercfg-")
		if err == nil {
			dockerCfgDir = d
			track(resource{Kind: "procdir", Name: d})
		}
	})
	env := baseEnv()
	if dockerCfgDir != "" {
		env = append(env, "DOCKER_CONFIG="+dockerCfgDir)
	}
	return env
}

// DockerHost is the value for DOCKER_HOST / docker -H of this host.
func (h *Host) DockerHost() string { return "unix://" + h.DockerSock }

// Docker runs /usr/bin/docker -H <this host> args... (bounded by
// CommandTimeout) and returns stdout without surrounding white space. The
// error carries the exit status and stderr. The most frequent commands
// (run -d, exec, rm -f, inspect -f, ps -q) are answered in-process through
// the Engine API with the same stdout and error text (see dockerapi.go;
// CNME2E_DOCKER_CLI=1 runs the CLI for all).
func (h *Host) Docker(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return h.DockerCtx(context.Background(), args...)
}

// DockerCtx is Docker with a context (for shorter deadlines or goroutines).
func (h *Host) DockerCtx(ctx context.Context, args ...string) (string, error) {
	return h.dockerWithin(ctx, CommandTimeout, args...)
}

// DockerWithin is Docker bounded by timeout instead of CommandTimeout.
func (h *Host) DockerWithin(timeout time.Duration, args ...string) (string, error) {
	return h.dockerWithin(context.Background(), timeout, args...)
}

func (h *Host) dockerWithin(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	argv := append([]string{DockerPath, "-H", h.DockerHost()}, args...)
	out, err := h.dockerAPI(ctx, timeout, argv, args)
	if errors.Is(err, errUseCLI) {
		out, err = runCmdTimeout(ctx, timeout, dockerEnv(), argv...)
	}
	return strings.TrimSpace(out), err
}

// MustDocker is Docker that fails the test on error.
func (h *Host) MustDocker(t testing.TB, args ...string) string {
	t.Helper()
	out, err := h.Docker(t, args...)
	if err != nil {
		t.Fatalf("%s: %v", h.Name, err)
	}
	return out
}

// ---------------------------------------------------------------- commands in the netns

// Exec runs argv in the host's network namespace (nsenter --net; root mount
// namespace) and returns stdout; the error carries the exit status and stderr.
func (h *Host) Exec(t testing.TB, argv ...string) (string, error) {
	t.Helper()
	return h.ExecCtx(context.Background(), argv...)
}

// ExecCtx is Exec with a context.
func (h *Host) ExecCtx(ctx context.Context, argv ...string) (string, error) {
	return runCmd(ctx, nil, append([]string{"nsenter", "--net=" + h.NetnsPath, "--"}, argv...)...)
}

// MustExec is Exec that fails the test on error.
func (h *Host) MustExec(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := h.Exec(t, argv...)
	if err != nil {
		t.Fatalf("%s: %v", h.Name, err)
	}
	return out
}

// ---------------------------------------------------------------- the plugin

// Socket names the plugin creates in PluginDir.
const (
	NetworkSocket = "calico.sock"
	IpamSocket    = "calico-ipam.sock"
)

// ServeArgs are the default arguments of the daemon on this host:
//
//	serve --socket-dir PluginDir --state-dir StateDir --nodename Name --log-level debug
//
// plus, when env has no (or an empty) ETCD_ENDPOINTS, the embedded etcd member
// on the host's own loopback (each netns has its own, so fixed ports are fine):
//
//	--etcd-listen-client http://127.0.0.1:2379 --etcd-listen-peer http://127.0.0.1:2380
func (h *Host) ServeArgs(env []string) []string {
	args := []string{"serve", "--socket-dir", h.PluginDir, "--state-dir", h.StateDir,
		"--nodename", h.Name, "--log-level", "debug"}
	if envValue(env, "ETCD_ENDPOINTS") == "" {
		args = append(args, "--etcd-listen-client", "http://127.0.0.1:2379", "--etcd-listen-peer", "http://127.0.0.1:2380")
	}
	return args
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// StartPlugin runs bin (the calico-cnm binary) in the host's network
// namespace (root mount namespace) with args (default: h.ServeArgs(env)) and
// env added to a clean environment that already has DOCKER_HOST=<this host's
// dockerd>. It logs to Dir/plugin-N.log and returns once both
// PluginDir/calico.sock and PluginDir/calico-ipam.sock answer
// POST /Plugin.Activate (stale socket files of a killed daemon do not count).
func (h *Host) StartPlugin(t testing.TB, bin string, env []string, args ...string) *Process {
	t.Helper()
	return h.StartPluginSockets(t, []string{NetworkSocket, IpamSocket}, bin, env, args...)
}

// StartPluginSockets is StartPlugin waiting for the given socket names.
func (h *Host) StartPluginSockets(t testing.TB, sockets []string, bin string, env []string, args ...string) *Process {
	t.Helper()
	if len(args) == 0 {
		args = h.ServeArgs(env)
	}
	var paths []string
	for _, s := range sockets {
		paths = append(paths, filepath.Join(h.PluginDir, s))
	}
	h.mu.Lock()
	h.nplugins++
	name := fmt.Sprintf("plugin-%d", h.nplugins)
	h.mu.Unlock()
	p := h.StartProcess(t, name, env, func(ctx context.Context) error {
		for _, s := range paths {
			if _, err := PluginActivate(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}, append([]string{bin}, args...)...)
	t.Logf("harness: %s on %s (pid %d) ready", p.Name, h.Name, p.Pid())
	return p
}

// StartProcess runs argv as a long-running process in the host's network
// namespace (root mount namespace): a BGP daemon, iperf3 -s, a second plugin.
// env is added to a clean environment that has DOCKER_HOST=<this host>; the
// log goes to Dir/<name>.log (kept across restarts); ready (may be nil) is
// polled until it returns nil, within PluginStartTimeout. The process is
// stopped (SIGTERM, then SIGKILL) on cleanup, after dockerd; its log tail is
// dumped if the test failed.
func (h *Host) StartProcess(t testing.TB, name string, env []string, ready func(ctx context.Context) error, argv ...string) *Process {
	t.Helper()
	fullEnv := append(baseEnv(), "DOCKER_HOST="+h.DockerHost())
	fullEnv = append(fullEnv, env...)
	nsArgv := append([]string{"nsenter", "--net=" + h.NetnsPath, "--"}, argv...)
	p := newProcess(name, filepath.Join(h.Dir, name+".log"), nsArgv, fullEnv, ready)
	p.dumpedOnFailure = true
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	p.start(t, PluginStartTimeout)
	return p
}

// TCPReady is a readiness check for StartProcess: addr ("ip:port") accepts
// TCP connections from the root namespace (e.g. a fabric host's IP).
func TCPReady(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// PluginActivate POSTs /Plugin.Activate to the plugin socket at path and
// returns what it implements.
func PluginActivate(ctx context.Context, path string) ([]string, error) {
	var resp struct {
		Implements []string
		Err        string
	}
	if err := PluginCall(ctx, path, "/Plugin.Activate", struct{}{}, &resp); err != nil {
		return nil, err
	}
	if len(resp.Implements) == 0 {
		return nil, fmt.Errorf("%s: Plugin.Activate: no Implements in the answer", path)
	}
	return resp.Implements, nil
}

// unixSocketClient is an HTTP client of the server on the unix socket at
// path (any host in a URL reaches it).
func unixSocketClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}}
}

// PluginCall POSTs req as JSON to method (e.g. "/NetworkDriver.GetCapabilities")
// on the plugin socket at path, like dockerd does, and decodes the answer into
// resp (may be nil). A non-200 answer is an error carrying the body.
func PluginCall(ctx context.Context, path, method string, req, resp any) error {
	c := unixSocketClient(path)
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://plugin"+method, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	r.Header.Set("Accept", "application/vnd.docker.plugins.v1.2+json")
	r.Header.Set("Content-Type", "application/json")
	res, err := c.Do(r)
	if err != nil {
		return fmt.Errorf("%s %s: %w", path, method, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d: %s", path, method, res.StatusCode, strings.TrimSpace(string(b)))
	}
	if resp != nil {
		if err := json.Unmarshal(b, resp); err != nil {
			return fmt.Errorf("%s %s: decoding %q: %w", path, method, b, err)
		}
	}
	return nil
}

// Processes returns the plugins and other processes started on this host.
func (h *Host) Processes() []*Process {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Process(nil), h.procs...)
}

// ---------------------------------------------------------------- cleanup

// killLeftovers SIGKILLs (by pid tree) every process in the mount namespaces
// of this host's dockerd incarnations and - when all is true - also every
// process in the host's network namespace (plugin, containerd, shims,
// --net=host containers, and via the trees the containers under the shims).
// A running dockerd and running plugins are spared unless all.
func (h *Host) killLeftovers(all bool) []int {
	h.mu.Lock()
	mnts := append([]uint64(nil), h.mntInos...)
	h.mu.Unlock()
	var spare map[int]bool
	if !all {
		spare = map[int]bool{}
		if h.dockerd != nil && h.dockerd.Running() {
			spare[h.dockerd.Pid()] = true
			if ino := nsInode(h.dockerd.Pid(), "mnt"); ino != 0 {
				// never sweep the live incarnation's namespace
				var keep []uint64
				for _, m := range mnts {
					if m != ino {
						keep = append(keep, m)
					}
				}
				mnts = keep
			}
		}
	}
	var netIno uint64
	if all {
		netIno = h.netIno
	}
	var roots []int
	for _, pid := range procsInNamespaces(netIno, mnts...) {
		// The kernel reuses a namespace's inode number once the namespace
		// is freed: the mount namespace of an exited dockerd incarnation
		// may by now be another host's (tests run in parallel). Every
		// process of this host's dockerd runs in this host's netns.
		if !spare[pid] && nsInode(pid, "net") == h.netIno {
			roots = append(roots, pid)
		}
	}
	if len(roots) == 0 {
		return nil
	}
	return killTrees(10*time.Second, roots...)
}

func (h *Host) cleanup() {
	t := h.t
	begin := time.Now()
	defer func() {
		t.Logf("harness: cleanup of host %s took %s", h.Name, time.Since(begin).Round(time.Millisecond))
	}()
	step := func(what string, f func()) {
		began := time.Now()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("harness: cleanup of %s: %s panicked: %v", h.Name, what, r)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Logf("harness: cleanup of %s: %s took %s", h.Name, what, took.Round(time.Millisecond))
			}
		}()
		f()
	}
	if t.Failed() {
		step("dump logs", func() { h.DumpLogs(t, 50) })
	}
	// Containers first, while dockerd and the plugin are still there to
	// release their endpoints and addresses.
	if h.dockerd != nil && h.dockerd.Running() {
		step("remove containers", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			ids, err := h.DockerCtx(ctx, "ps", "-aq")
			if err != nil {
				t.Logf("harness: cleanup of %s: %v", h.Name, err)
				return
			}
			if f := strings.Fields(ids); len(f) > 0 {
				if _, err := h.DockerCtx(ctx, append([]string{"rm", "-f", "-v"}, f...)...); err != nil {
					t.Logf("harness: cleanup of %s: %v", h.Name, err)
				}
			}
		})
	}
	// dockerd before the plugin: it may call the plugin while shutting down.
	if h.dockerd != nil {
		step("stop dockerd", func() {
			if clean, _ := h.dockerd.stop(StopTimeout); !clean {
				t.Logf("harness: cleanup of %s: dockerd (pid %d) needed SIGKILL after %s", h.Name, h.dockerd.Pid(), StopTimeout)
			}
		})
	}
	h.closeAPIClient()
	if h.mntHolder != nil {
		step("stop the mount namespace holder", func() { h.mntHolder.stop(StopTimeout) })
	}
	for _, p := range h.Processes() {
		step("stop "+p.Name, func() {
			if clean, _ := p.stop(StopTimeout); !clean {
				t.Logf("harness: cleanup of %s: %s (pid %d) needed SIGKILL after %s", h.Name, p.Name, p.Pid(), StopTimeout)
			}
		})
	}
	step("kill leftover processes", func() {
		if alive := h.killLeftovers(true); len(alive) > 0 {
			t.Errorf("harness: cleanup of %s: processes survive SIGKILL: %v", h.Name, alive)
		}
	})
	if h.RootVeth != "" {
		step("delete veth", func() {
			if _, err := net.InterfaceByName(h.RootVeth); err == nil {
				if _, err := runCmd(nil, nil, "ip", "link", "delete", h.RootVeth); err != nil {
					t.Errorf("harness: cleanup of %s: %v", h.Name, err)
				}
			}
		})
	}
	step("delete netns", func() {
		if _, err := os.Stat(h.NetnsPath); err == nil {
			if _, err := runCmd(nil, nil, "ip", "netns", "delete", h.Netns); err != nil {
				t.Errorf("harness: cleanup of %s: %v", h.Name, err)
			}
		}
	})
	step("remove dir", func() {
		if t.Failed() && os.Getenv("CNME2E_KEEP") != "" {
			_ = os.RemoveAll(filepath.Join(h.Dir, "root"))
			t.Logf("harness: CNME2E_KEEP set: logs of %s kept in %s", h.Name, h.Dir)
			return
		}
		if err := os.RemoveAll(h.Dir); err != nil {
			t.Errorf("harness: cleanup of %s: %v", h.Name, err)
		}
	})
	for _, u := range h.untracks {
		u()
	}
}

// DumpLogs writes the last n lines of the logs of dockerd and of every
// process started on the host to t.Log.
func (h *Host) DumpLogs(t testing.TB, n int) {
	t.Helper()
	if h.dockerd != nil {
		t.Logf("==== %s: last %d lines of %s ====\n%s", h.Name, n, h.dockerd.LogPath, TailFile(h.dockerd.LogPath, n))
	}
	for _, p := range h.Processes() {
		t.Logf("==== %s: last %d lines of %s ====\n%s", h.Name, n, p.LogPath, TailFile(p.LogPath, n))
	}
}
