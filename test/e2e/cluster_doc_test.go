package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// docs/cluster.md run as written on three hosts. Each host is a netns on
// one fabric plus a private mount namespace (the directories below), a UTS
// namespace with its own hostname, and its own dockerd with its defaults
// (as on a fresh install). What the test does instead of the page is
// listed in the page's "How this page is tested"; keep both in step.

const clusterDoc = "docs/cluster.md"

// clusterPrivateDirs are each host's own: what the page writes or what
// would differ between real hosts. /run is a tmpfs.
var clusterPrivateDirs = []string{
	"/etc/calico-cnm", "/etc/default", "/etc/docker", "/etc/etcd", "/etc/systemd/system",
	"/root", "/usr/local/bin", "/usr/local/sbin",
	"/var/lib/calico-cnm", "/var/lib/docker", "/var/lib/etcd", "/var/log",
}

// clusterEnvValue matches the assignments of the cluster-env block the test
// replaces: the hosts' addresses and the registry's.
var clusterEnvValue = regexp.MustCompile(`(?m)\b(HOST[1-3]_IP|REGISTRY)=(\S+)`)

// clusterHost is one of the page's hosts.
type clusterHost struct {
	*harness.Host
	name string // hostname: node1, node2, node3
	main *harness.Process
	dirs string // sources of the private directories
}

// root is a path inside the host's mount namespace, seen from here.
func (h *clusterHost) root(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", h.main.Pid(), p)
}

func (h *clusterHost) ns(kind string) string {
	return fmt.Sprintf("/proc/%d/ns/%s", h.main.Pid(), kind)
}

// shell runs script with sh -e inside the host (netns, mount and UTS
// namespaces), in dir, with root's login environment.
func (h *clusterHost) shell(ctx context.Context, dir, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+h.NetnsPath, "--mount="+h.ns("mnt"), "--uts="+h.ns("uts"), "--wd="+dir, "--", "sh", "-e", "-c", script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "USER=root", "LANG=C.UTF-8"}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// clusterDocTest is the page, the hosts and the substitutions.
type clusterDocTest struct {
	doc      string
	fabric   *harness.Fabric
	hosts    []*clusterHost
	envBlock string // cluster-env with the fabric's addresses
	base     string // t.TempDir made before the hosts, so removed after them
}

// newClusterDocTest checks the page's packages and starts the three hosts
// with dockerd (dockerdArgs added: they get the registry's address, empty
// without registryHost).
func newClusterDocTest(t *testing.T, registryHost bool, dockerdArgs func(registry string) []string) *clusterDocTest {
	t.Helper()
	harness.RequirePrereqs(t)
	for path, what := range map[string]string{
		harness.EtcdPath: "package etcd-server", "/usr/bin/etcdctl": "package etcd-client",
		"/usr/bin/openssl": "package openssl", "/usr/sbin/nft": "package nftables",
		"/lib/systemd/system/etcd.service": "etcd-server's unit",
	} {
		harness.RequireFile(t, path, what)
	}
	if registryHost {
		harness.RequireFile(t, "/usr/bin/docker-registry", "docker-registry (Debian package docker-registry)")
	}
	etcdUser, err := user.Lookup("etcd")
	if err != nil {
		t.Fatalf("etcd-server is installed but there is no etcd user: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), clusterDoc))
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterDocTest{doc: string(b), base: t.TempDir()}
	c.checkPackages(t)
	systemctl := harness.BuildPackage(t, "./test/e2e/internal/systemctl")
	c.fabric = harness.NewFabric(t, "")

	registry := ""
	if registryHost {
		registry = c.startRegistry(t)
	}
	for i := 1; i <= 3; i++ {
		c.hosts = append(c.hosts, c.addHost(t, i, dockerdArgs(registry), systemctl, etcdUser))
	}
	// Registered after the hosts: runs before their cleanup, while dockerd
	// still answers, so that it stops quickly.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, h := range c.hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, _ := h.shell(ctx, "/", `ids=$(docker ps -aq); [ -z "$ids" ] || docker rm -f $ids
docker plugin disable -f calico 2>/dev/null; docker plugin rm -f calico 2>/dev/null
systemctl stop calico-cnm etcd 2>/dev/null; true`)
				if t.Failed() {
					t.Logf("%s cleanup:\n%s\n%s: calico-cnm.service log:\n%s\netcd.service log:\n%s\ndockerd log:\n%s", h.name, out, h.name,
						harness.TailFile(h.root("/var/log/calico-cnm.service.log"), 40), harness.TailFile(h.root("/var/log/etcd.service.log"), 20), h.main.LogTail(30))
				}
			}()
		}
		wg.Wait()
	})

	vals := map[string]string{"REGISTRY": registry}
	for i, h := range c.hosts {
		vals[fmt.Sprintf("HOST%d_IP", i+1)] = h.IP.String()
	}
	env := c.block(t, "cluster-env")
	seen := map[string]bool{}
	c.envBlock = clusterEnvValue.ReplaceAllStringFunc(env, func(m string) string {
		k := clusterEnvValue.FindStringSubmatch(m)[1]
		seen[k] = true
		return k + "=" + vals[k]
	})
	if len(seen) != len(vals) {
		t.Fatalf("cluster-env assigns %v, the test replaces %v: update the test or the page", seen, vals)
	}
	for i, h := range c.hosts {
		if !strings.Contains(env, fmt.Sprintf("HOST%d=%s ", i+1, h.name)) {
			t.Fatalf("cluster-env does not name host %d %s", i+1, h.name)
		}
	}
	c.writeScp(t)
	return c
}

// block is a marked ```sh block of the page.
func (c *clusterDocTest) block(t *testing.T, name string) string {
	t.Helper()
	return markedBlock(t, clusterDoc, c.doc, name)
}

// checkPackages: every package the install line names is installed (a
// test host cannot run apt-get).
func (c *clusterDocTest) checkPackages(t *testing.T) {
	t.Helper()
	line := strings.TrimSpace(c.block(t, "cluster-packages"))
	pkgs, ok := strings.CutPrefix(line, "apt-get install -y ")
	if !ok || strings.Contains(pkgs, "\n") {
		t.Fatalf("cluster-packages is not one apt-get install -y line: %q", line)
	}
	for _, p := range strings.Fields(pkgs) {
		// dpkg keeps the file list of every installed package.
		harness.RequireFile(t, "/var/lib/dpkg/info/"+p+".list", "package "+p+" of "+clusterDoc)
	}
}

func (c *clusterDocTest) startRegistry(t *testing.T) string {
	t.Helper()
	reg := c.fabric.AddHost(t, "registry", harness.HostOptions{NoDockerd: true})
	addr := reg.IP.String() + ":5000"
	dir := filepath.Join(c.base, "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	reg.StartProcess(t, "docker-registry", nil, harness.TCPReady(addr), "/usr/bin/docker-registry", "serve", filepath.Join(dir, "config.yml"))
	return addr
}

// addHost starts host i: its netns, private directories (as the packages
// leave them: /var/lib/etcd the etcd user's), hostname and dockerd.
func (c *clusterDocTest) addHost(t *testing.T, i int, dockerdArgs []string, systemctl string, etcdUser *user.User) *clusterHost {
	t.Helper()
	h := &clusterHost{name: fmt.Sprintf("node%d", i), dirs: filepath.Join(c.base, fmt.Sprintf("node%d", i))}
	var mounts []string
	for _, d := range clusterPrivateDirs {
		src := filepath.Join(h.dirs, strings.ReplaceAll(strings.TrimPrefix(d, "/"), "/", "_"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", d, src, d))
	}
	etcdDir := filepath.Join(h.dirs, "var_lib_etcd")
	uid, _ := strconv.Atoi(etcdUser.Uid)
	gid, _ := strconv.Atoi(etcdUser.Gid)
	if err := os.Chown(etcdDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(etcdDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(h.dirs, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	copyFile(t, systemctl, filepath.Join(h.dirs, "usr_local_sbin", "systemctl"), 0o755)
	h.Host = c.fabric.AddHost(t, h.name, harness.HostOptions{NoDockerd: true})
	// /run/netns is unmounted first: a private copy of the other tests'
	// netns mounts would keep their namespaces alive until this host ends.
	wrapper := "set -e; umount -l /run/netns 2>/dev/null || true; mount -t tmpfs tmpfs /run; " + strings.Join(mounts, "; ") +
		"; hostname " + h.name + "; exec dockerd " + strings.Join(dockerdArgs, " ")
	h.main = h.StartProcess(t, h.name+"-dockerd", []string{"DOCKER_HOST="}, nil, "unshare", "-m", "-u", "--propagation", "private", "sh", "-c", wrapper)
	harness.Eventually(t, 2*time.Minute, 250*time.Millisecond, h.name+": dockerd answers", func() error {
		if h.main.Exited() {
			return fmt.Errorf("exited: %v\n%s", h.main.ExitErr(), h.main.LogTail(30))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := h.shell(ctx, "/", "docker version -f '{{.Server.Version}}'")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	// The page runs `busybox`; these hosts cannot pull it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := h.shell(ctx, "/", filepath.Join(harness.ModuleRoot(t), "scripts", "import-busybox.sh")); err != nil {
		t.Fatalf("%s: import-busybox.sh: %v\n%s", h.name, err, out)
	}
	return h
}

// writeScp installs the scp stand-in on every host: it copies into the
// private /root of the host with the destination's address.
func (c *clusterDocTest) writeScp(t *testing.T) {
	t.Helper()
	var cases strings.Builder
	for _, h := range c.hosts {
		fmt.Fprintf(&cases, "\t%s) root=%s ;;\n", h.IP, h.root("/root"))
	}
	script := `#!/bin/sh
# scp stand-in of the e2e test (docs/cluster.md): cp into the private /root
# of the test host whose address the destination names.
set -e
r=
while [ $# -gt 0 ]; do
	case $1 in -r) r=-r; shift ;; -*) shift ;; *) break ;; esac
done
srcs=
for a in "$@"; do srcs="$srcs $dest"; dest=$a; done
host=${dest%%:*}; path=${dest#*:}
case ${host#*@} in
` + cases.String() + `	*) echo "scp stand-in: unknown host $host" >&2; exit 1 ;;
esac
cp $r $srcs "$root/$path"
`
	for _, h := range c.hosts {
		if err := os.WriteFile(filepath.Join(h.dirs, "usr_local_sbin", "scp"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// run pastes the cluster-env block and block name into host h's shell in
// dir and returns the output; a failure fails the test.
func (c *clusterDocTest) run(t *testing.T, h *clusterHost, dir, name string) string {
	t.Helper()
	return c.runScript(t, h, dir, name, c.block(t, name))
}

func (c *clusterDocTest) runScript(t *testing.T, h *clusterHost, dir, name, script string) string {
	t.Helper()
	out, err := c.try(h, dir, script, 4*time.Minute)
	t.Logf("%s: %s:\n%s", h.name, name, out)
	if err != nil {
		t.Fatalf("%s: block %s failed: %v", h.name, name, err)
	}
	return out
}

func (c *clusterDocTest) try(h *clusterHost, dir, script string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The variables quietly, then the block with its commands echoed.
	return h.shell(ctx, dir, c.envBlock+"\nset -x\n"+script)
}

// runAll runs a block on every host at once, as in three terminals (the
// etcd block needs it: each member's start waits for a quorum).
func (c *clusterDocTest) runAll(t *testing.T, name string) []string {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(c.hosts))
	outs := make([]string, len(c.hosts))
	for i, h := range c.hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = c.try(h, "/root", c.block(t, name), 4*time.Minute)
		}()
	}
	wg.Wait()
	failed := false
	for i, h := range c.hosts {
		t.Logf("%s: %s:\n%s", h.name, name, outs[i])
		if errs[i] != nil {
			failed = true
			t.Errorf("%s: block %s failed: %v\ncalico-cnm log:\n%s\netcd log:\n%s", h.name, name, errs[i],
				harness.TailFile(h.root("/var/log/calico-cnm.service.log"), 20), harness.TailFile(h.root("/var/log/etcd.service.log"), 20))
		}
	}
	if failed {
		t.FailNow()
	}
	return outs
}

// runUntil repeats block name on h until it passes (at most timeout), as
// an operator reruns a check while things come up.
func (c *clusterDocTest) runUntil(t *testing.T, h *clusterHost, name string, timeout time.Duration) string {
	t.Helper()
	var out string
	harness.Eventually(t, timeout, 2*time.Second, h.name+": block "+name+" passes", func() error {
		var err error
		if out, err = c.try(h, "/root", c.block(t, name), time.Minute); err != nil {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	})
	t.Logf("%s: %s:\n%s", h.name, name, out)
	return out
}

// setUpEtcd runs the firewall, certificate and etcd blocks: a 3-member
// etcd cluster with TLS, behind the page's input filter.
func (c *clusterDocTest) setUpEtcd(t *testing.T) {
	t.Helper()
	c.runAll(t, "cluster-firewall")
	c.run(t, c.hosts[0], "/root", "cluster-pki")
	c.runAll(t, "cluster-etcd")
	out := c.runUntil(t, c.hosts[1], "cluster-etcd-check", time.Minute)
	if n := strings.Count(out, "is healthy"); n != 3 {
		t.Errorf("etcdctl endpoint health: %d healthy members, want 3", n)
	}
	for _, h := range c.hosts {
		if !strings.Contains(out, h.name+", https://"+h.IP.String()+":2380, https://"+h.IP.String()+":2379") {
			t.Errorf("member list lacks %s with TLS peer and client URLs", h.name)
		}
	}
	// Only clients with a certificate of the CA get in.
	if out, err := c.try(c.hosts[2], "/root", `etcdctl --endpoints "https://$HOST1_IP:2379" --cacert ~/tls/ca.pem --command-timeout 3s get /`, time.Minute); err == nil {
		t.Errorf("etcd answered a client without a certificate:\n%s", out)
	}
}

// buildDir is what the build machine's checkout holds after `make build`:
// bin/calico-cnm at version, and the repository's contrib/.
func buildDir(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	buildVersion(t, version, filepath.Join(dir, "bin", "calico-cnm"))
	if err := os.Symlink(filepath.Join(harness.ModuleRoot(t), "contrib"), filepath.Join(dir, "contrib")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// buildVersion builds ./cmd/calico-cnm as the Makefile does (its LDFLAGS,
// the version given); only the link step is not in the build cache.
func buildVersion(t *testing.T, version, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -X main.Version="+version, "-o", out, "./cmd/calico-cnm")
	cmd.Dir = harness.ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build (version %s): %v\n%s", version, err, b)
	}
	t.Logf("built calico-cnm %s in %s", version, time.Since(start).Round(time.Millisecond))
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// probeIP is the address of host h's probe container on calnet.
func (c *clusterDocTest) probeIP(t *testing.T, h *clusterHost) string {
	t.Helper()
	out, err := c.try(h, "/", `docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' probe-$(hostname)`, time.Minute)
	ip := net.ParseIP(strings.TrimSpace(lastLine(out)))
	if err != nil || ip == nil {
		t.Fatalf("%s: probe address: %v\n%s", h.name, err, out)
	}
	return ip.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// checkCluster runs the probe check on every host: each sees its peers
// Established and its probe answers from every probe.
func (c *clusterDocTest) checkCluster(t *testing.T, peerType string) {
	t.Helper()
	for _, h := range c.hosts {
		out := c.runUntil(t, h, "cluster-check", 90*time.Second)
		if n := strings.Count(out, "2 packets received"); n != len(c.hosts) {
			t.Errorf("%s: %d probes answered, want %d", h.name, n, len(c.hosts))
		}
		if peerType != "" {
			for _, o := range c.hosts {
				if o != h && !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(o.IP.String())+`\s+`+peerType+`\s.*Established`).MatchString(out) {
					t.Errorf("%s: node status has no Established %s session with %s", h.name, peerType, o.name)
				}
			}
		}
	}
}

// pingRing starts `ping -i 0.2` from each host's probe to the next host's.
func (c *clusterDocTest) pingRing(t *testing.T) []*probePing {
	t.Helper()
	var ps []*probePing
	for i, h := range c.hosts {
		to := c.hosts[(i+1)%len(c.hosts)]
		p := &probePing{c: c, h: h, ctr: "probe-" + h.name, to: c.probeIP(t, to)}
		if out, err := c.try(h, "/", "docker exec -d "+p.ctr+" sh -c 'exec ping -i 0.2 "+p.to+" >/tmp/ping.log 2>&1'", time.Minute); err != nil {
			t.Fatalf("%s: start ping: %v\n%s", h.name, err, out)
		}
		harness.Eventually(t, 10*time.Second, 200*time.Millisecond, h.name+": ping answered", func() error {
			if out := p.log(); !strings.Contains(out, "seq=") {
				return fmt.Errorf("no reply yet: %s", out)
			}
			return nil
		})
		ps = append(ps, p)
	}
	return ps
}

type probePing struct {
	c       *clusterDocTest
	h       *clusterHost
	ctr, to string
}

func (p *probePing) log() string {
	out, _ := p.c.try(p.h, "/", "docker exec "+p.ctr+" cat /tmp/ping.log", time.Minute)
	return out
}

// stop ends ping with SIGINT (busybox prints its statistics) and returns
// how many were sent, and the sequence numbers that got no answer although
// a later one did (the last one may still be on its way at the SIGINT).
func (p *probePing) stop(t *testing.T) (tx int, lost []int) {
	t.Helper()
	if out, err := p.c.try(p.h, "/", "docker exec "+p.ctr+" sh -c 'kill -INT $(pidof ping)'", time.Minute); err != nil {
		t.Fatalf("%s: stop ping: %v\n%s", p.h.name, err, out)
	}
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, p.h.name+": ping statistics", func() error {
		var ok bool
		if tx, lost, ok = pingOutcome(p.log()); !ok {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	return tx, lost
}

// stopPings checks that no ping was lost across what happened since start
// (each ping's sequence number n was sent about n/5 s after its start).
func stopPings(t *testing.T, ps []*probePing, start time.Time) {
	t.Helper()
	secs := time.Since(start).Seconds()
	for _, p := range ps {
		tx, lost := p.stop(t)
		t.Logf("%s -> %s: %d pings sent in about %.0f s, lost (sequence numbers): %v", p.h.name, p.to, tx, secs, lost)
		if float64(tx) < secs*3 || len(lost) > 0 {
			t.Errorf("%s -> %s lost %d of %d pings during the rolling upgrade: %v", p.h.name, p.to, len(lost), tx, lost)
		}
	}
}

// probeIPs are every probe's address, by host.
func (c *clusterDocTest) probeIPs(t *testing.T) map[string]string {
	t.Helper()
	ips := map[string]string{}
	for _, h := range c.hosts {
		ips[h.name] = c.probeIP(t, h)
	}
	return ips
}

// TestClusterDoc runs docs/cluster.md with calico-cnm as a host service on
// three hosts: etcd with TLS, the systemd unit from contrib/ (through the
// systemctl stand-in), the BGP mesh, the checks; then a rolling upgrade of
// the three hosts to a binary with another version while every probe pings
// the next host's every 0.2 s, with no loss; then route reflectors and VXLAN.
func TestClusterDoc(t *testing.T) {
	t.Parallel()
	c := newClusterDocTest(t, false, func(string) []string { return nil })
	c.setUpEtcd(t)
	v1, v2 := "1.0-test-"+randHexE2E(3), "2.0-test-"+randHexE2E(3)
	c.run(t, c.hosts[0], buildDir(t, v1), "cluster-copy")
	for _, out := range c.runAll(t, "cluster-host-service") {
		requireOutput(t, out, "calico-cnm "+v1)
	}
	c.runAll(t, "cluster-probe")
	c.checkCluster(t, "mesh")
	before := c.probeIPs(t)

	t.Run("rolling upgrade", func(t *testing.T) {
		dir := buildDir(t, v2)
		start := time.Now()
		pings := c.pingRing(t)
		c.run(t, c.hosts[0], dir, "cluster-copy")
		for _, h := range c.hosts {
			pid := c.daemonPid(t, h)
			t.Logf("%s: upgrade starts %.1f s into the ping stream", h.name, time.Since(start).Seconds())
			out := c.run(t, h, "/root", "cluster-upgrade-host-service")
			requireOutput(t, out, "calico-cnm "+v2)
			if now := c.daemonPid(t, h); now == pid {
				t.Errorf("%s: the daemon was not restarted (pid %d)", h.name, pid)
			} else if exe, err := os.ReadFile(fmt.Sprintf("/proc/%d/exe", now)); err != nil || !bytes.Contains(exe, []byte(v2)) {
				t.Errorf("%s: the running daemon (pid %d) is not version %s (%v)", h.name, now, v2, err)
			}
		}
		stopPings(t, pings, start)
		if after := c.probeIPs(t); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("probe addresses changed across the upgrade: %v -> %v", before, after)
		}
		c.checkCluster(t, "mesh")
	})

	t.Run("route reflectors", func(t *testing.T) {
		c.run(t, c.hosts[0], "/root", "cluster-route-reflectors")
		for _, h := range c.hosts[1:] {
			harness.Eventually(t, time.Minute, time.Second, h.name+": only the reflector's session", func() error {
				out, err := c.try(h, "/root", "calico-cnm node status", time.Minute)
				if err != nil || strings.Count(out, "Established") != 1 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(c.hosts[0].IP.String())+`\s+reflector\s.*Established`).MatchString(out) {
					return fmt.Errorf("%v\n%s", err, out)
				}
				return nil
			})
		}
		c.checkCluster(t, "")
	})

	t.Run("vxlan", func(t *testing.T) {
		out := c.run(t, c.hosts[0], "/root", "cluster-vxlan")
		requireOutput(t, out, "Always")
		for _, h := range c.hosts {
			harness.Eventually(t, time.Minute, time.Second, h.name+": VXLAN routes to the others", func() error {
				out, err := c.try(h, "/", "ip route show proto 82", time.Minute)
				if n := strings.Count(out, "dev vxlan.calico"); err != nil || n < len(c.hosts)-1 {
					return fmt.Errorf("%d VXLAN routes: %v\n%s", n, err, out)
				}
				return nil
			})
		}
		c.checkCluster(t, "")
	})
}

// daemonPid is the host service's pid, from the systemctl stand-in.
func (c *clusterDocTest) daemonPid(t *testing.T, h *clusterHost) int {
	t.Helper()
	b, err := os.ReadFile(h.root("/run/systemctl-standin/calico-cnm.service.pid"))
	if err != nil {
		t.Fatalf("%s: calico-cnm.service pid: %v", h.name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// publish runs the cluster-publish block for version: its `make plugin`
// line is replaced by what that writes (bin/plugin), the rest runs as
// written on host1 with the version's tag.
func (c *clusterDocTest) publish(t *testing.T, version string) {
	t.Helper()
	block := c.block(t, "cluster-publish")
	first, rest, _ := strings.Cut(block, "\n")
	if first != "make plugin NO_CREATE=1 VERSION=1.0" {
		t.Fatalf("cluster-publish starts with %q: update the test's stand-in for it", first)
	}
	dir := buildDir(t, version)
	rootfs := filepath.Join(dir, "bin", "plugin", "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dir, "bin", "calico-cnm"), filepath.Join(rootfs, "calico-cnm"), 0o755)
	copyFile(t, filepath.Join(harness.ModuleRoot(t), "config.json"), filepath.Join(dir, "bin", "plugin", "config.json"), 0o644)
	c.runScript(t, c.hosts[0], dir, "cluster-publish "+version, strings.ReplaceAll(rest, ":1.0", ":"+version))
	if version == "1.0" {
		c.run(t, c.hosts[0], dir, "cluster-copy")
	}
}

// TestClusterDocManaged runs docs/cluster.md with the managed plugin:
// published to a registry, installed, set and enabled on three hosts, the
// checks, then the upgrade to a new tag (disable, upgrade, enable) one host
// at a time while the probes ping each other every 0.2 s, with no loss.
func TestClusterDocManaged(t *testing.T) {
	t.Parallel()
	c := newClusterDocTest(t, true, func(registry string) []string { return []string{"--insecure-registry", registry} })
	c.setUpEtcd(t)
	c.publish(t, "1.0")
	for _, out := range c.runAll(t, "cluster-managed") {
		requireOutput(t, out, "calico-cnm 1.0")
	}
	c.runAll(t, "cluster-probe")
	c.checkCluster(t, "mesh")
	before := c.probeIPs(t)

	c.publish(t, "2.0")
	start := time.Now()
	pings := c.pingRing(t)
	for _, h := range c.hosts {
		t.Logf("%s: upgrade starts %.1f s into the ping stream", h.name, time.Since(start).Seconds())
		out := c.run(t, h, "/root", "cluster-upgrade-managed")
		if !regexp.MustCompile(`(?m)^[0-9.]+:5000/calico-cnm:2\.0$`).MatchString(out) {
			t.Errorf("%s: the plugin's reference after the upgrade is not the 2.0 tag", h.name)
		}
		set, err := c.try(h, "/", "docker plugin inspect -f '{{.Settings.Env}}' calico", time.Minute)
		if err != nil || !strings.Contains(set, "NODENAME="+h.name) || !strings.Contains(set, "ETCD_ENDPOINTS=https://") {
			t.Errorf("%s: settings after the upgrade: %v %s", h.name, err, set)
		}
	}
	stopPings(t, pings, start)
	if after := c.probeIPs(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("probe addresses changed across the upgrade: %v -> %v", before, after)
	}
	c.checkCluster(t, "mesh")
}
