package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestSmoke proves the harness itself, without the calico daemon: a dockerd
// per network namespace (no bridge), the bridge-driver baseline, plugin
// discovery through the host's private /run/docker/plugins (with a fake
// driver), a two-host fabric with etcd, and that cleanup leaves nothing behind.
func TestSmoke(t *testing.T) {
	harness.RequirePrereqs(t)
	start := time.Now()
	t.Run("hosts", func(t *testing.T) {
		t.Run("none-network", testSmokeNoneNetwork)
		t.Run("bridge-baseline", testSmokeBridgeBaseline)
		t.Run("fake-plugin", testSmokeFakePlugin)
		t.Run("fabric", testSmokeFabric)
	})
	t.Run("no-leftovers", func(t *testing.T) {
		// Every host's cleanup has run by now (subtests above are done).
		if left := harness.Leftovers(); len(left) > 0 {
			t.Errorf("cleanup left behind: %s", strings.Join(left, "\n  "))
		}
		list, err := os.ReadDir("/var/run/netns")
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		created := map[string]bool{}
		for _, n := range harness.CreatedNetns() {
			created[n] = true
		}
		if len(created) == 0 {
			t.Errorf("no network namespace was recorded as created")
		}
		for _, e := range list {
			if created[e.Name()] {
				t.Errorf("netns %s still exists", e.Name())
			}
		}
		pids := harness.CreatedPids()
		if len(pids) == 0 {
			t.Errorf("no process was recorded as started")
		}
		for _, pid := range pids {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && isRunning(pid) {
				t.Errorf("pid %d still alive: %s", pid, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	})
	t.Logf("smoke test took %s", time.Since(start).Round(time.Millisecond))
}

func isRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}

func testSmokeNoneNetwork(t *testing.T) {
	t.Parallel()
	h := harness.NewHost(t, "none", harness.HostOptions{})
	h.ImportBusybox(t)
	if out := h.MustDocker(t, "run", "--rm", "--net", "none", harness.Image, "sh", "-c", "echo ok"); out != "ok" {
		t.Fatalf("docker run printed %q, want ok", out)
	}
	// dockerd runs in the host's netns: only lo there, no docker0.
	links := h.MustExec(t, "ip", "-o", "link", "show")
	if strings.Contains(links, "docker0") || !strings.Contains(links, "lo:") {
		t.Errorf("links in %s:\n%s", h.Netns, links)
	}
	if nets := h.MustDocker(t, "network", "ls", "--format", "{{.Name}}"); strings.Contains(nets, "bridge") {
		t.Errorf("--bridge none still has a bridge network:\n%s", nets)
	}
	if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", h.Dockerd().Pid())); ns == "" || ns == mustReadlink(t, "/proc/self/ns/net") {
		t.Errorf("dockerd is not in its own network namespace (%q)", ns)
	}
	// A long-running container is removed by the cleanup.
	h.MustDocker(t, "run", "-d", "--name", "sleeper", "--net", "none", harness.Image, "sleep", "600")

	// The image with extra dynamically linked binaries (iperf3 for the benchmarks).
	t.Run("iperf3-image", func(t *testing.T) {
		harness.RequireFile(t, iperf3Path, "iperf3, for the benchmarks")
		h.ImportImage(t, "bbiperf", iperf3Path)
		out := h.MustDocker(t, "run", "--rm", "--net", "none", "bbiperf", "iperf3", "--version")
		if !strings.Contains(out, "iperf") {
			t.Errorf("iperf3 --version: %q", out)
		}
	})
}

const iperf3Path = "/usr/bin/iperf3"

func mustReadlink(t *testing.T, p string) string {
	s, err := os.Readlink(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testSmokeBridgeBaseline(t *testing.T) {
	t.Parallel()
	h := harness.NewHost(t, "bridge", harness.HostOptions{Bridge: true})
	h.ImportBusybox(t)
	subnet := h.MustDocker(t, "network", "inspect", "bridge", "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}")
	out := h.MustDocker(t, "run", "--rm", harness.Image, "ip", "-4", "addr", "show", "eth0")
	m := regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/\d+`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no IPv4 address on eth0 (bridge subnet %s):\n%s", subnet, out)
	}
	t.Logf("container on the default bridge got %s (subnet %s)", m[1], subnet)
	if !strings.HasPrefix(subnet, "172.17.") || !strings.HasPrefix(m[1], "172.17.") {
		t.Errorf("expected docker's default 172.17.0.0/16, got %s in %s", m[1], subnet)
	}
	// docker0 and dockerd's NAT rules live in the host's netns.
	h.MustExec(t, "ip", "link", "show", "docker0")
	if nat := h.MustExec(t, "iptables", "-w", "-t", "nat", "-S", "POSTROUTING"); !strings.Contains(nat, "MASQUERADE") {
		t.Errorf("no MASQUERADE rule in the host's netns:\n%s", nat)
	}
	// Containers on the bridge reach each other.
	h.MustDocker(t, "run", "-d", "--name", "target", harness.Image, "sleep", "600")
	ip := h.MustDocker(t, "inspect", "-f", "{{.NetworkSettings.IPAddress}}", "target")
	h.MustDocker(t, "run", "--rm", harness.Image, "ping", "-c", "1", "-W", "5", ip)
}

func testSmokeFakePlugin(t *testing.T) {
	t.Parallel()
	fake := harness.BuildPackage(t, "./test/e2e/harness/internal/fakeplugin")
	h := harness.NewHost(t, "fake", harness.HostOptions{DockerdDebug: true})
	p := h.StartPlugin(t, fake, nil)
	if ns, want := mustReadlink(t, fmt.Sprintf("/proc/%d/ns/net", p.Pid())), mustReadlink(t, fmt.Sprintf("/proc/%d/ns/net", h.Dockerd().Pid())); ns != want {
		t.Errorf("plugin in %s, dockerd in %s", ns, want)
	}
	if !p.LogContains("DOCKER_HOST=" + h.DockerHost()) {
		t.Errorf("plugin did not get DOCKER_HOST:\n%s", p.LogTail(5))
	}
	create := func(name, subnet string) {
		t.Helper()
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", subnet, name)
		if d := h.MustDocker(t, "network", "inspect", "-f", "{{.Driver}}/{{.IPAM.Driver}}", name); d != "calico/calico-ipam" {
			t.Errorf("network %s: drivers %q", name, d)
		}
	}
	// dockerd finds the sockets through its private /run/docker/plugins.
	create("fake1", "10.233.0.0/16")
	if !p.LogContains("/NetworkDriver.CreateNetwork") || !p.LogContains("/IpamDriver.RequestPool") {
		t.Errorf("plugin was not called:\n%s", p.LogTail(20))
	}

	// Crash: the sockets stay behind, stale; Restart waits for the new ones.
	oldPid := p.Pid()
	p.Kill9(t)
	if _, err := os.Stat(filepath.Join(h.PluginDir, harness.NetworkSocket)); err != nil {
		t.Errorf("expected a stale socket after SIGKILL: %v", err)
	}
	p.Restart(t)
	if p.Pid() == oldPid {
		t.Errorf("Restart kept pid %d", oldPid)
	}
	create("fake2", "10.234.0.0/16")
	h.MustDocker(t, "network", "rm", "fake1", "fake2")
	if !p.LogContains("/NetworkDriver.DeleteNetwork") {
		t.Errorf("DeleteNetwork not seen:\n%s", p.LogTail(20))
	}
	// A clean stop: SIGTERM, exit status 0, sockets removed.
	if err := p.Stop(t); err != nil {
		t.Errorf("plugin exit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.PluginDir, harness.NetworkSocket)); !os.IsNotExist(err) {
		t.Errorf("socket still there after a clean stop: %v", err)
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Errorf("Signal on a stopped process did not fail")
	}
	p.Start(t) // left running: the cleanup stops it
	// RestartDockerd keeps networks, and a live plugin is found again.
	create("fake3", "10.235.0.0/16")
	h.RestartDockerd(t)
	if out := h.MustDocker(t, "network", "ls", "--filter", "driver=calico", "--format", "{{.Name}}"); out != "fake3" {
		t.Errorf("networks after a dockerd restart: %q", out)
	}
}

func testSmokeFabric(t *testing.T) {
	t.Parallel()
	f := harness.NewFabric(t, "")
	a := f.AddHost(t, "a", harness.HostOptions{NoDockerd: true})
	b := f.AddHost(t, "b", harness.HostOptions{NoDockerd: true})
	a.MustExec(t, harness.BusyboxPath, "ping", "-c", "1", "-W", "5", b.IP.String())
	b.MustExec(t, harness.BusyboxPath, "ping", "-c", "1", "-W", "5", f.Gateway.String())
	if route := a.MustExec(t, "ip", "-4", "route", "show", "default"); !strings.Contains(route, "via "+f.Gateway.String()) {
		t.Errorf("default route of a: %q", route)
	}
	// A long-running helper in a host's netns, reached from another host.
	t.Run("iperf3", func(t *testing.T) {
		harness.RequireFile(t, iperf3Path, "iperf3, for the benchmarks")
		srv := a.StartProcess(t, "iperf3-server", nil, harness.TCPReady(a.IP.String()+":5201"), iperf3Path, "-s")
		out := b.MustExec(t, iperf3Path, "-c", a.IP.String(), "-t", "1", "-J")
		if !strings.Contains(out, "bits_per_second") {
			t.Errorf("iperf3 client: %.300s", out)
		}
		if !srv.Running() {
			t.Errorf("iperf3 server exited: %v", srv.ExitErr())
		}
	})
	t.Run("etcd", func(t *testing.T) {
		harness.RequireFile(t, harness.EtcdPath, "etcd-server, for multi-host tests")
		ep := f.StartEtcd(t)
		out := b.MustExec(t, harness.BusyboxPath, "wget", "-q", "-O", "-", ep+"/health")
		if !strings.Contains(out, "true") {
			t.Errorf("etcd health from host b: %q", out)
		}
	})
}
