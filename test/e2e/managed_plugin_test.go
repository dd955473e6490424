package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// managedPlugin is calico-cnm installed as a Docker managed plugin on one
// netns host, built and created by scripts/build-plugin.sh as `make plugin`
// does.
type managedPlugin struct {
	*harness.Host
	name   string // as created, e.g. "calico"; Docker's reference is name + ":latest"
	driver string // what --driver and --ipam-driver take: name + ":latest"
	bin    string // the binary the script built (also the operator CLI)
	dir    string // the script's output: bin, plugin/, a docker CLI config
}

// createManagedPlugin runs the real build script against h's dockerd and
// registers the cleanup that removes the plugin (and what uses it) before
// the harness stops dockerd. The plugin is left disabled, as
// `docker plugin create` leaves it.
func createManagedPlugin(t *testing.T, h *harness.Host, name string) *managedPlugin {
	t.Helper()
	dir := t.TempDir()
	mp := &managedPlugin{Host: h, name: name, driver: name + ":latest", bin: filepath.Join(dir, "calico-cnm"), dir: dir}
	mp.buildScript(t)
	// Registered after the host's cleanup, so it runs before it: containers
	// and networks go while the plugin can still release their addresses,
	// then the plugin itself, then the harness stops dockerd.
	t.Cleanup(func() { mp.remove(t) })
	return mp
}

// buildScript runs scripts/build-plugin.sh as `make plugin` would, with
// extra environment (e.g. REPLACE=1).
func (mp *managedPlugin) buildScript(t *testing.T, extraEnv ...string) {
	t.Helper()
	root := harness.ModuleRoot(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		harness.RequireFile(t, "/usr/local/go/bin/go", "the Go toolchain (the build script compiles the plugin)")
		goBin = "/usr/local/go/bin/go"
	}
	cfg := filepath.Join(mp.dir, "docker-config")
	if err := os.MkdirAll(cfg, 0o700); err != nil {
		t.Fatal(err)
	}
	env := append([]string{
		"PLUGIN_NAME=" + mp.name,
		"PLUGIN_DIR=" + filepath.Join(mp.dir, "plugin"),
		"BIN=" + mp.bin,
		"GO=" + goBin,
		"DOCKER=" + harness.DockerPath,
		"DOCKER_HOST=" + mp.DockerHost(),
		"DOCKER_CONFIG=" + cfg,
	}, extraEnv...)
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH",
			"PLUGIN_NAME", "PLUGIN_DIR", "BIN", "GO", "DOCKER", "VERSION", "NO_CREATE", "REPLACE", "USE_DOCKER_BUILD":
		default:
			env = append(env, kv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "build-plugin.sh"))
	cmd.Dir = root
	cmd.Env = env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/build-plugin.sh: %v\n%s", err, out)
	}
	t.Logf("build-plugin.sh took %s:\n%s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
}

// configure points the plugin's mounts at this host's own state dir and
// the directory of its dockerd socket (the defaults are the machine's
// /var/lib/calico-cnm and /run) and names the node after the harness host.
func (mp *managedPlugin) configure(t *testing.T, logLevel string) {
	t.Helper()
	mp.MustDocker(t, "plugin", "set", mp.name, "state.source="+mp.StateDir, "dockerdir.source="+filepath.Dir(mp.DockerSock),
		"NODENAME="+mp.Name, "LOG_LEVEL="+logLevel)
}

func (mp *managedPlugin) remove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	docker := func(args ...string) {
		if out, err := mp.DockerCtx(ctx, args...); err != nil {
			t.Logf("cleanup: docker %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	if mp.Dockerd() == nil || !mp.Dockerd().Running() {
		return
	}
	// A disabled plugin cannot tear down endpoints.
	if en, _ := mp.DockerCtx(ctx, "plugin", "inspect", "-f", "{{.Enabled}}", mp.name); en == "false" {
		docker("plugin", "enable", mp.name)
	}
	if ids, err := mp.DockerCtx(ctx, "ps", "-aq"); err == nil && ids != "" {
		docker(append([]string{"rm", "-f", "-v"}, strings.Fields(ids)...)...)
	}
	if nets, err := mp.DockerCtx(ctx, "network", "ls", "-q", "--filter", "driver="+mp.driver); err == nil && nets != "" {
		docker(append([]string{"network", "rm"}, strings.Fields(nets)...)...)
	}
	docker("plugin", "disable", "-f", mp.name)
	docker("plugin", "rm", "-f", mp.name)
}

// cli runs the host's CLI against the plugin's embedded member: its
// root-only socket is in the state mount's source, the test's StateDir
// rather than /var/lib/calico-cnm, so the environment says where.
func (mp *managedPlugin) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return mp.Exec(t, append([]string{"env", plugin.EnvStateDir + "=" + mp.StateDir, mp.bin}, args...)...)
}

// usedIPs counts the allocated addresses, with the host's CLI.
func (mp *managedPlugin) usedIPs(t *testing.T) int {
	t.Helper()
	out, err := mp.cli(t, "ipam", "show", "-o", "json")
	if err != nil {
		t.Fatalf("ipam show: %v\n%s", err, out)
	}
	var usage []blockUsage
	if err := json.Unmarshal([]byte(out), &usage); err != nil {
		t.Fatalf("ipam show -o json: %v\n%s", err, out)
	}
	n := 0
	for _, b := range usage {
		n += b.Used
	}
	return n
}

// pluginID is Docker's id of the plugin: dockerd tags the plugin's log
// lines with plugin=<id>.
func (mp *managedPlugin) pluginID(t *testing.T) string {
	t.Helper()
	return mp.MustDocker(t, "plugin", "inspect", "-f", "{{.Id}}", mp.name)
}

func (mp *managedPlugin) enabled(t *testing.T) bool {
	t.Helper()
	return mp.MustDocker(t, "plugin", "inspect", "-f", "{{.Enabled}}", mp.name) == "true"
}

func (mp *managedPlugin) containerIP(t *testing.T, name, network string) net.IP {
	t.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, network)
	out := mp.MustDocker(t, "inspect", "-f", tmpl, name)
	ip := net.ParseIP(out)
	if ip == nil {
		t.Fatalf("container %s has no IPv4 address on %s (inspect said %q)", name, network, out)
	}
	return ip
}

func (mp *managedPlugin) ping(t *testing.T, from string, to net.IP) {
	t.Helper()
	if out, err := mp.Docker(t, "exec", from, "ping", "-c", "2", "-W", "2", to.String()); err != nil {
		t.Errorf("%s cannot ping %s: %v\n%s", from, to, err, out)
	}
}

// pluginLog is what dockerd logged for the plugin (its stdout and stderr)
// from byte offset on, and the log's size.
func (mp *managedPlugin) pluginLog(t *testing.T, id string, offset int) (string, int) {
	t.Helper()
	b, err := os.ReadFile(mp.DockerdLog())
	if err != nil {
		t.Fatal(err)
	}
	if offset > len(b) {
		offset = len(b)
	}
	var lines []string
	for _, l := range strings.Split(string(b[offset:]), "\n") {
		if strings.Contains(l, "plugin="+id) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n"), len(b)
}

// debugLine is how a debug line of the daemon looks inside dockerd's log:
// dockerd quotes each line the plugin writes into its own msg="...".
var debugLine = regexp.MustCompile(`level=debug msg=\\"plugin request\\"`)

// TestManagedPlugin is the managed-plugin user story: `make plugin`'s script
// creates the plugin on a dockerd, `docker plugin set/enable` configure and
// start it, containers on a network of its drivers reach each other, and
// the plugin survives a disable / set / enable cycle with running
// containers (their dataplane is in the kernel, not in the plugin).
func TestManagedPlugin(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	// On a fabric: proxy ARP needs the host to have a default route.
	h := harness.NewFabric(t, "").AddHost(t, "managed", harness.HostOptions{})
	h.ImportBusybox(t)
	mp := createManagedPlugin(t, h, "calico")
	d := func(args ...string) string { return mp.MustDocker(t, args...) }

	if mp.enabled(t) {
		t.Fatalf("docker plugin create left %s enabled", mp.name)
	}
	if types := d("plugin", "inspect", "-f", "{{.Config.Interface.Types}}", mp.name); !strings.Contains(types, "docker.networkdriver/1.0") || !strings.Contains(types, "docker.ipamdriver/1.0") {
		t.Fatalf("plugin implements %s, want both the network and the IPAM driver interface", types)
	}
	mp.configure(t, "info")
	d("plugin", "enable", mp.name)
	id := mp.pluginID(t)
	logAtEnable, _ := mp.pluginLog(t, id, 0)

	t.Run("untagged driver names are refused", func(t *testing.T) {
		// What docs/managed-plugin.md explains: Docker registers a managed
		// plugin's drivers under name:tag only.
		if out, err := mp.Docker(t, "network", "create", "--driver", mp.name, "--ipam-driver", mp.driver, "--subnet", "192.168.0.0/16", "untagged"); err == nil {
			t.Errorf("--driver %s (no tag) worked: %s; update docs/managed-plugin.md", mp.name, out)
		}
		if out, err := mp.Docker(t, "network", "create", "--driver", mp.driver, "--ipam-driver", mp.name, "--subnet", "192.168.0.0/16", "untagged"); err == nil {
			t.Errorf("--ipam-driver %s (no tag) worked: %s; update docs/managed-plugin.md", mp.name, out)
		}
		mp.Docker(t, "network", "rm", "untagged")
	})

	d("network", "create", "--driver", mp.driver, "--ipam-driver", mp.driver, "--subnet", "192.168.0.0/16", "net1")
	// sleep ignores SIGTERM: --stop-timeout 1 keeps the dockerd restart
	// below from waiting 10 s per container.
	d("run", "-d", "--name", "c1", "--stop-timeout", "1", "--net", "net1", harness.Image, "sleep", "3600")
	d("run", "-d", "--name", "c2", "--stop-timeout", "1", "--net", "net1", harness.Image, "sleep", "3600")
	ip1, ip2 := mp.containerIP(t, "c1", "net1"), mp.containerIP(t, "c2", "net1")
	t.Logf("c1=%s c2=%s", ip1, ip2)

	t.Run("containers reach each other", func(t *testing.T) {
		mp.ping(t, "c1", ip2)
		mp.ping(t, "c2", ip1)
		if r := d("exec", "c1", "ip", "route"); !strings.Contains(r, "default via 169.254.1.1 dev eth0") {
			t.Errorf("container routes lack the 169.254.1.1 default:\n%s", r)
		}
	})

	t.Run("dataplane on the host", func(t *testing.T) {
		routes := h.MustExec(t, "ip", "-4", "route", "show")
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip1.String()) + ` dev (cali[0-9a-f]{11}) proto 80 scope link`)
		m := re.FindStringSubmatch(routes)
		if m == nil {
			t.Fatalf("no /32 route via a cali veth for %s in the host's netns:\n%s", ip1, routes)
		}
		// The per-interface sysctls went through the writable host
		// /proc/sys mount (the plugin's own /proc/sys is read-only).
		for _, key := range []string{"proxy_arp", "forwarding"} {
			v, err := h.Exec(t, "cat", "/proc/sys/net/ipv4/conf/"+m[1]+"/"+key)
			if err != nil || strings.TrimSpace(v) != "1" {
				t.Errorf("%s of %s = %q (%v), want 1", key, m[1], v, err)
			}
		}
	})

	t.Run("state and node name", func(t *testing.T) {
		// The embedded etcd wrote through the state mount into StateDir.
		if _, err := os.Stat(filepath.Join(h.StateDir, "etcd", "member")); err != nil {
			t.Errorf("no embedded etcd data under the state mount's source: %v", err)
		}
		// The host CLI reaches the plugin's embedded member.
		out, err := mp.cli(t, "ipam", "show")
		if err != nil {
			t.Fatalf("ipam show: %v\n%s", err, out)
		}
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(blockOf(ip1)) + `\s+192\.168\.0\.0/16\s+` + regexp.QuoteMeta(h.Name) + `\s+2\s`).MatchString(out) {
			t.Errorf("ipam show does not list block %s of host %s with 2 addresses used:\n%s", blockOf(ip1), h.Name, out)
		}
	})

	t.Run("disable set enable with running containers", func(t *testing.T) {
		if debugLine.MatchString(logAtEnable) {
			t.Fatalf("the plugin logged debug lines with LOG_LEVEL=info:\n%s", logAtEnable)
		}
		if out, err := mp.Docker(t, "plugin", "set", mp.name, "LOG_LEVEL=debug"); err == nil {
			t.Errorf("docker plugin set on an enabled plugin worked: %s", out)
		}
		// A network using the plugin holds a reference: without -f Docker
		// refuses, and the README says so.
		out, err := mp.Docker(t, "plugin", "disable", mp.name)
		if err == nil {
			t.Fatalf("docker plugin disable without -f worked while net1 uses the plugin: %s", out)
		}
		if !strings.Contains(err.Error(), "in use") {
			t.Errorf("disable without -f failed, but not because the plugin is in use: %v", err)
		}
		start := time.Now()
		d("plugin", "disable", "-f", mp.name)
		t.Logf("docker plugin disable -f took %s", time.Since(start).Round(time.Millisecond))
		if mp.enabled(t) {
			t.Fatalf("plugin still enabled after disable -f")
		}
		// No plugin process: the containers' veths and routes are the
		// kernel's, so traffic keeps flowing.
		mp.ping(t, "c1", ip2)

		d("plugin", "set", mp.name, "LOG_LEVEL=debug")
		if env := d("plugin", "inspect", "-f", "{{.Settings.Env}}", mp.name); !strings.Contains(env, "LOG_LEVEL=debug") {
			t.Errorf("plugin env after set: %s", env)
		}
		_, offset := mp.pluginLog(t, id, 0)
		start = time.Now()
		d("plugin", "enable", mp.name)
		t.Logf("docker plugin enable took %s", time.Since(start).Round(time.Millisecond))

		mp.ping(t, "c1", ip2)
		mp.ping(t, "c2", ip1)
		d("run", "-d", "--name", "c3", "--stop-timeout", "1", "--net", "net1", harness.Image, "sleep", "3600")
		ip3 := mp.containerIP(t, "c3", "net1")
		if ip3.Equal(ip1) || ip3.Equal(ip2) {
			t.Errorf("c3 got %s, an address already in use (c1=%s c2=%s): the restarted plugin lost its state", ip3, ip1, ip2)
		}
		if blockOf(ip3) != blockOf(ip1) {
			t.Errorf("c3 got %s outside this host's block %s: the restarted plugin lost its block affinity", ip3, blockOf(ip1))
		}
		mp.ping(t, "c3", ip1)
		mp.ping(t, "c1", ip3)

		after, _ := mp.pluginLog(t, id, offset)
		if !debugLine.MatchString(after) {
			t.Errorf("no debug line from the plugin after LOG_LEVEL=debug; its log since enable:\n%s", after)
		}
	})

	t.Run("removal while disabled is reconciled", func(t *testing.T) {
		d("run", "-d", "--name", "c5", "--stop-timeout", "1", "--net", "net1", harness.Image, "sleep", "3600")
		ip5 := mp.containerIP(t, "c5", "net1")
		usedBefore := mp.usedIPs(t)
		hostIf := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip5.String()) + ` dev (cali[0-9a-f]{11})`).FindStringSubmatch(h.MustExec(t, "ip", "-4", "route", "show"))
		if hostIf == nil {
			t.Fatalf("no route to c5 (%s)", ip5)
		}
		d("plugin", "disable", "-f", mp.name)
		// dockerd removes the container although it cannot tell the
		// plugin: it moves the container's end of the veth back to the
		// host, and the veth pair, its route, the endpoint record and the
		// address stay behind. (The datastore cannot be read now: the
		// embedded etcd runs inside the plugin.)
		start := time.Now()
		d("rm", "-f", "c5")
		t.Logf("docker rm -f with the plugin disabled took %s", time.Since(start).Round(time.Millisecond))
		if _, err := h.Exec(t, "ip", "link", "show", hostIf[1]); err != nil {
			t.Logf("%s went with the container (%v): reconcile has less to do", hostIf[1], err)
		}
		// args (extra serve flags) are settable; a short grace lets the
		// reconcile loop act within the test. It reaches Docker through
		// the dockerdir mount.
		d("plugin", "set", mp.name, "args=--reconcile-grace 2s")
		if args := d("plugin", "inspect", "-f", "{{json .Settings.Args}}", mp.name); args != `["--reconcile-grace","2s"]` {
			t.Errorf("plugin args after set: %s", args)
		}
		d("plugin", "enable", mp.name)
		enabled := time.Now()
		harness.Eventually(t, 60*time.Second, time.Second, "the address of the container removed while the plugin was disabled is released", func() error {
			if n := mp.usedIPs(t); n != usedBefore-1 {
				return fmt.Errorf("%d addresses used, want %d", n, usedBefore-1)
			}
			return nil
		})
		// The default grace is 20 s: a release well before proves that the
		// args reached the daemon.
		if took := time.Since(enabled); took > 15*time.Second {
			t.Errorf("reconcile released the address %s after enable; with --reconcile-grace 2s it should be seconds", took.Round(time.Second))
		}
		if out, _ := mp.cli(t, "network", "list", "-o", "json"); !strings.Contains(out, `"endpoints": 3`) {
			t.Errorf("net1 should have 3 endpoints (c1 c2 c3) after reconcile:\n%s", out)
		}
		harness.Eventually(t, 30*time.Second, time.Second, "the veth of the removed container is deleted", func() error {
			if _, err := h.Exec(t, "ip", "link", "show", hostIf[1]); err == nil {
				return fmt.Errorf("%s still exists", hostIf[1])
			}
			return nil
		})
		if routes := h.MustExec(t, "ip", "-4", "route", "show"); strings.Contains(routes, ip5.String()+" dev cali") {
			t.Errorf("route of removed c5 (%s) is still there:\n%s", ip5, routes)
		}
		mp.ping(t, "c1", ip2)
	})

	t.Run("replace with running containers", func(t *testing.T) {
		// The upgrade path of a locally built plugin (REPLACE=1 make
		// plugin): the new plugin has the same name, hence the same driver
		// names, and the state is in the state mount, not in the plugin.
		mp.buildScript(t, "REPLACE=1", "VERSION=e2e-replaced")
		if mp.enabled(t) {
			t.Fatal("the replaced plugin is enabled before docker plugin enable")
		}
		if newID := mp.pluginID(t); newID == id {
			t.Fatalf("REPLACE=1 kept the old plugin %s", id)
		}
		if v := mp.MustExec(t, mp.bin, "version"); strings.TrimSpace(v) != "calico-cnm e2e-replaced" {
			t.Errorf("rebuilt binary says %q", v)
		}
		mp.configure(t, "info")
		d("plugin", "enable", mp.name)
		mp.ping(t, "c1", ip2)
		d("run", "-d", "--name", "c4", "--stop-timeout", "1", "--net", "net1", harness.Image, "sleep", "3600")
		ip4 := mp.containerIP(t, "c4", "net1")
		for _, other := range []net.IP{ip1, ip2} {
			if ip4.Equal(other) {
				t.Errorf("c4 got %s, already in use: the replaced plugin lost the IPAM state", ip4)
			}
		}
		mp.ping(t, "c4", ip1)
		d("rm", "-f", "c4")
	})

	t.Run("dockerd restart", func(t *testing.T) {
		// dockerd stops its plugins (and, without live-restore, the
		// containers) and starts the enabled plugins again before it
		// serves its API: the plugin must come up without waiting for
		// that API, else dockerd's start would wait for the plugin.
		before := mp.pluginID(t)
		start := time.Now()
		h.RestartDockerd(t)
		t.Logf("dockerd restart took %s", time.Since(start).Round(time.Millisecond))
		if !mp.enabled(t) {
			t.Fatal("the plugin is not enabled after the dockerd restart")
		}
		d("start", "c1", "c2", "c3")
		ip1, ip2 = mp.containerIP(t, "c1", "net1"), mp.containerIP(t, "c2", "net1")
		mp.ping(t, "c1", ip2)
		mp.ping(t, "c2", ip1)
		if after := mp.pluginID(t); after != before {
			t.Errorf("plugin id changed across the dockerd restart: %s -> %s", before, after)
		}
	})

	t.Run("remove releases everything", func(t *testing.T) {
		d("rm", "-f", "c1", "c2", "c3")
		if n := mp.usedIPs(t); n != 0 {
			t.Errorf("%d address(es) still allocated after removing every container", n)
		}
		if links := h.MustExec(t, "ip", "-o", "link", "show"); strings.Contains(links, "cali") {
			t.Errorf("cali veths left:\n%s", links)
		}
		d("network", "rm", "net1")
	})
}

// TestManagedPluginLiveRestore: under dockerd --live-restore the enabled
// managed plugin keeps running through a dockerd restart, as the containers
// do (same process, same addresses, traffic flows), and afterwards still
// reaches Docker's API - which dockerd serves on a socket it re-creates at
// every start: a network created after the restart gets its Docker name
// recorded (the policy asks Docker for it).
func TestManagedPluginLiveRestore(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	h := harness.NewFabric(t, "").AddHost(t, "mplive", harness.HostOptions{LiveRestore: true})
	h.ImportBusybox(t)
	mp := createManagedPlugin(t, h, "calico")
	d := func(args ...string) string { return mp.MustDocker(t, args...) }
	mp.configure(t, "info")
	d("plugin", "enable", mp.name)
	id := mp.pluginID(t)
	d("network", "create", "--driver", mp.driver, "--ipam-driver", mp.driver, "--subnet", "192.168.0.0/16", "net1")
	pids := map[string]string{}
	ips := map[string]net.IP{}
	for _, c := range []string{"c1", "c2"} {
		d("run", "-d", "--restart=always", "--name", c, "--net", "net1", harness.Image, "sleep", "3600")
		pids[c] = d("inspect", "-f", "{{.State.Pid}}", c)
		ips[c] = mp.containerIP(t, c, "net1")
	}
	mp.ping(t, "c1", ips["c2"])
	_, mark := mp.pluginLog(t, id, 0)

	h.RestartDockerd(t)
	if !mp.enabled(t) {
		t.Fatal("the plugin is not enabled after the dockerd restart")
	}
	for _, c := range []string{"c1", "c2"} {
		if got := d("inspect", "-f", "{{.State.Pid}}", c); got != pids[c] {
			t.Errorf("%s: pid %s after the restart, want %s (live restore keeps the process)", c, got, pids[c])
		}
		if got := mp.containerIP(t, c, "net1"); !got.Equal(ips[c]) {
			t.Errorf("%s: %s after the restart, had %s", c, got, ips[c])
		}
	}
	mp.ping(t, "c1", ips["c2"])
	mp.ping(t, "c2", ips["c1"])
	if after, _ := mp.pluginLog(t, id, mark); strings.Contains(after, "serving plugin API") {
		t.Errorf("the plugin was restarted with dockerd; live restore should keep it running:\n%s", after)
	}

	d("network", "create", "--driver", mp.driver, "--ipam-driver", mp.driver, "--subnet", "192.168.0.0/16", "net2")
	harness.Eventually(t, 30*time.Second, 500*time.Millisecond, "the plugin reaches Docker's API after the restart (net2's name recorded)", func() error {
		if after, _ := mp.pluginLog(t, id, mark); !strings.Contains(after, `name=net2`) {
			return fmt.Errorf("not yet; plugin log since the restart:\n%s", after)
		}
		return nil
	})
	// A fresh container works too (on net1: networks are isolated).
	d("run", "-d", "--name", "c3", "--net", "net1", harness.Image, "sleep", "3600")
	mp.ping(t, "c3", ips["c1"])
}
