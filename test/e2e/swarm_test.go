package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// The swarm test: three netns Docker hosts on one fabric, one etcd, the
// managed plugin on each dockerd in global scope with BGP, the dockerds
// joined as one swarm (a manager, two workers), and a service on a calico
// swarm network.

const (
	swPool    = "192.168.0.0/16"
	swNetwork = "calnet"
	swService = "web"
)

// swarmHost is one node: its dockerd with the managed plugin.
type swarmHost struct {
	*managedPlugin
}

// swarmCluster is the fabric, the shared etcd and the nodes; hosts[0] is
// the manager.
type swarmCluster struct {
	etcd  string
	bin   string // the operator CLI, run in the root namespace
	hosts []*swarmHost
	// image is the busybox image by id, the same on every node: a task
	// whose image is an id is not pulled (a name would make every node
	// try the registry first, ~20 s of DNS timeouts here).
	image string
}

// ctl runs the operator CLI against the shared etcd.
func (c *swarmCluster) ctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := mhRun(context.Background(), append([]string{c.bin}, append(args, "--etcd-endpoints", c.etcd)...)...)
	if err != nil {
		t.Fatalf("calico-cnm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// usage is `ipam show -o json`: the used addresses per block and its host.
func (c *swarmCluster) usage(t *testing.T) []blockUsage {
	t.Helper()
	var us []blockUsage
	out := c.ctl(t, "ipam", "show", "-o", "json")
	if err := json.Unmarshal([]byte(out), &us); err != nil {
		t.Fatalf("ipam show -o json: %v\n%s", err, out)
	}
	return us
}

func (c *swarmCluster) usedIPs(t *testing.T) int {
	n := 0
	for _, u := range c.usage(t) {
		n += u.Used
	}
	return n
}

// newSwarmCluster builds the plugin once (scripts/build-plugin.sh, as
// `make plugin NO_CREATE=1`), then on each host creates it from that
// directory, configures and enables it in global scope with BGP.
func newSwarmCluster(t *testing.T, names ...string) *swarmCluster {
	t.Helper()
	harness.RequirePrereqs(t)
	f := harness.NewFabric(t, "")
	c := &swarmCluster{etcd: f.StartEtcd(t)}
	dir := t.TempDir()
	c.bin = filepath.Join(dir, "calico-cnm")
	imageTar := filepath.Join(dir, "bb.tar")
	for i, name := range names {
		h := f.AddHost(t, name, harness.HostOptions{})
		if i == 0 {
			h.ImportBusybox(t)
			h.MustDocker(t, "save", "-o", imageTar, harness.Image)
			c.image = h.MustDocker(t, "image", "inspect", "-f", "{{.Id}}", harness.Image)
		} else {
			h.MustDocker(t, "load", "-q", "-i", imageTar)
			if id := h.MustDocker(t, "image", "inspect", "-f", "{{.Id}}", harness.Image); id != c.image {
				t.Fatalf("%s: image %s has id %s, not %s as on %s", name, harness.Image, id, c.image, names[0])
			}
		}
		mp := &managedPlugin{Host: h, name: "calico", driver: "calico:latest", bin: c.bin, dir: dir}
		if i == 0 {
			mp.buildScript(t, "NO_CREATE=1")
		}
		h.MustDocker(t, "plugin", "create", mp.name, filepath.Join(dir, "plugin"))
		// After the host's cleanup, so it runs before it (see
		// createManagedPlugin).
		t.Cleanup(func() { mp.remove(t) })
		mp.MustDocker(t, "plugin", "set", mp.name,
			"state.source="+h.StateDir, "dockerdir.source="+filepath.Dir(h.DockerSock),
			"NODENAME="+h.Name, "LOG_LEVEL=debug", "ETCD_ENDPOINTS="+c.etcd,
			"args=--scope global --bgp --block-release-grace 1s --resync-interval 2s --bgp-sync-timeout 20s --reconcile-grace 5s")
		mp.MustDocker(t, "plugin", "enable", mp.name)
		c.hosts = append(c.hosts, &swarmHost{managedPlugin: mp})
	}
	c.ctl(t, "pool", "add", swPool)
	return c
}

// swarmTask is one running task: its node, container and address.
type swarmTask struct {
	host      *swarmHost
	container string
	ip        net.IP
}

func (k swarmTask) String() string {
	return fmt.Sprintf("%s/%s(%s)", k.host.Name, dataplane.ShortID(k.container), k.ip)
}

// tasks lists the running containers of service on every node. An error
// (a container going away meanwhile, no address yet) is for Eventually to
// retry.
func (c *swarmCluster) tasks(t *testing.T, service string) ([]swarmTask, error) {
	t.Helper()
	var out []swarmTask
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, swNetwork)
	for _, h := range c.hosts {
		ids, err := h.Docker(t, "ps", "-q", "--no-trunc", "--filter", "label=com.docker.swarm.service.name="+service)
		if err != nil {
			return nil, err
		}
		for _, id := range strings.Fields(ids) {
			s, err := h.Docker(t, "inspect", "-f", tmpl, id)
			ip := net.ParseIP(strings.TrimSpace(s))
			if err != nil || ip == nil {
				return nil, fmt.Errorf("%s: task container %s has no address on %s (%q, %v)", h.Name, dataplane.ShortID(id), swNetwork, s, err)
			}
			out = append(out, swarmTask{host: h, container: id, ip: ip})
		}
	}
	return out, nil
}

// waitTasks waits until n tasks of service run and returns them.
func (c *swarmCluster) waitTasks(t *testing.T, service string, n int, what string) []swarmTask {
	t.Helper()
	var tasks []swarmTask
	harness.Eventually(t, 120*time.Second, time.Second, what, func() error {
		var err error
		if tasks, err = c.tasks(t, service); err != nil {
			return err
		}
		if len(tasks) != n {
			ps, _ := c.hosts[0].Docker(t, "service", "ps", "--no-trunc", service)
			return fmt.Errorf("%d tasks running, want %d:\n%s", len(tasks), n, ps)
		}
		return nil
	})
	return tasks
}

// swPing pings to from container from on h, allowing for BGP to converge.
func swPing(t *testing.T, h *swarmHost, from string, to net.IP) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, 250*time.Millisecond, fmt.Sprintf("%s: %s pings %s", h.Name, dataplane.ShortID(from), to), func() error {
		out, err := h.Docker(t, "exec", from, "ping", "-c", "1", "-W", "1", to.String())
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

// TestSwarm is the swarm user story: with the shared etcd the plugin
// reports global scope; a calico network created with --scope swarm on the
// manager carries a service whose tasks, on several nodes, get calico-ipam
// addresses (assigned by the manager) and reach each other through the BGP
// routes; an attachable container joins them; removing everything releases
// every address and the network record.
func TestSwarm(t *testing.T) {
	t.Parallel()
	c := newSwarmCluster(t, "mgr", "wrk1", "wrk2")
	mgr := c.hosts[0]
	drv := mgr.driver

	t.Run("global scope outside swarm mode", func(t *testing.T) {
		// What the README says: a global-scope driver has no local
		// networks, and outside swarm mode no networks at all.
		out, err := mgr.Docker(t, "network", "create", "--driver", drv, "--ipam-driver", drv, "plain")
		t.Logf("docker network create (no swarm): %v %s", err, out)
		if err == nil || !strings.Contains(err.Error(), "This node is not a swarm manager") {
			t.Errorf("docker network create outside swarm mode with the global-scope driver: %v %s; want \"This node is not a swarm manager\"", err, out)
		}
		out, err = mgr.Docker(t, "network", "create", "--driver", drv, "--ipam-driver", drv, "--scope", "local", "plainlocal")
		t.Logf("docker network create --scope local: %v %s", err, out)
		if err == nil || !strings.Contains(err.Error(), "cannot downgrade network scope") {
			t.Errorf("--scope local with the global-scope driver: %v %s; want \"cannot downgrade network scope\"", err, out)
		}
	})

	// The swarm: ports 2377 (managers), 7946 (gossip) and 4789 (overlay
	// data) are open on the fabric; nothing of ours needs 4789.
	start := time.Now()
	mgr.MustDocker(t, "swarm", "init", "--advertise-addr", mgr.IP.String(), "--listen-addr", mgr.IP.String()+":2377")
	t.Cleanup(func() { c.leaveSwarm(t) })
	token := mgr.MustDocker(t, "swarm", "join-token", "-q", "worker")
	for _, h := range c.hosts[1:] {
		h.MustDocker(t, "swarm", "join", "--token", token, "--advertise-addr", h.IP.String(), mgr.IP.String()+":2377")
	}
	harness.Eventually(t, 60*time.Second, 500*time.Millisecond, "all nodes ready", func() error {
		out, err := mgr.Docker(t, "node", "ls", "--format", "{{.Status}} {{.Availability}}")
		if err != nil {
			return err
		}
		if n := strings.Count(out, "Ready Active"); n != len(c.hosts) {
			return fmt.Errorf("%d of %d nodes ready:\n%s", n, len(c.hosts), out)
		}
		return nil
	})
	t.Logf("swarm of %d nodes formed in %s", len(c.hosts), time.Since(start).Round(time.Millisecond))

	mgr.MustDocker(t, "network", "create", "--driver", drv, "--ipam-driver", drv, "--scope", "swarm", "--attachable", swNetwork)
	if scope := mgr.MustDocker(t, "network", "inspect", "-f", "{{.Scope}}", swNetwork); scope != "swarm" {
		t.Errorf("network %s has scope %q, want swarm", swNetwork, scope)
	}
	netID := mgr.MustDocker(t, "network", "inspect", "-f", "{{.ID}}", swNetwork)
	pluginLogStart := map[string]int{}
	for _, h := range c.hosts {
		_, pluginLogStart[h.Name] = h.pluginLog(t, h.pluginID(t), 0)
	}

	// A service in VIP mode without replicas: the manager assigns its VIP
	// from calico-ipam, and no endpoint ever holds it (the kernel here has
	// no IPVS, which VIP load balancing would need; dnsrr below does not).
	mgr.MustDocker(t, "service", "create", "--detach", "--no-resolve-image", "--name", "vip",
		"--network", swNetwork, "--replicas", "0", c.image, "sleep", "3600")
	var vip net.IP
	harness.Eventually(t, 30*time.Second, 500*time.Millisecond, "VIP allocated", func() error {
		out := mgr.MustDocker(t, "service", "inspect", "-f", "{{range .Endpoint.VirtualIPs}}{{.Addr}} {{end}}", "vip")
		ip, _, err := net.ParseCIDR(strings.TrimSpace(out))
		if err != nil {
			return fmt.Errorf("VirtualIPs %q: %v", out, err)
		}
		vip = ip
		return nil
	})
	t.Logf("service vip has the VIP %s", vip)

	// One task per node: tasks on every node, the manager's included.
	mgr.MustDocker(t, "service", "create", "--detach", "--no-resolve-image", "--name", swService,
		"--network", swNetwork, "--replicas", "3", "--replicas-max-per-node", "1",
		"--endpoint-mode", "dnsrr", "--stop-grace-period", "1s", c.image, "sleep", "3600")
	tasks := c.waitTasks(t, swService, 3, "3 tasks running")
	t.Logf("tasks: %v", tasks)

	t.Run("tasks on several nodes with calico-ipam addresses", func(t *testing.T) {
		nodes := map[string]bool{}
		seen := map[string]bool{}
		_, pool, _ := net.ParseCIDR(swPool)
		for _, k := range tasks {
			nodes[k.host.Name] = true
			if !pool.Contains(k.ip) {
				t.Errorf("task %v: address outside the calico pool %s", k, swPool)
			}
			if seen[k.ip.String()] {
				t.Errorf("task %v: address used twice", k)
			}
			seen[k.ip.String()] = true
			if r := k.host.MustDocker(t, "exec", k.container, "ip", "route"); !strings.Contains(r, "default via 169.254.1.1 dev eth0") {
				t.Errorf("task %v: no default route via 169.254.1.1:\n%s", k, r)
			}
		}
		if len(nodes) < 2 {
			t.Errorf("tasks on %d node(s), want at least 2: %v", len(nodes), tasks)
		}
		// The manager assigned them all: they sit in its blocks.
		hostOf := map[string]string{}
		for _, u := range c.usage(t) {
			hostOf[u.CIDR] = u.Host
		}
		for _, k := range tasks {
			if owner := hostOf[blockOf(k.ip)]; owner != mgr.Name {
				t.Errorf("task %v: its block %s belongs to %q, want the manager %s (the swarm allocator assigns)", k, blockOf(k.ip), owner, mgr.Name)
			}
		}
	})

	t.Run("one network record shared by the nodes", func(t *testing.T) {
		var recs []struct {
			ID        string            `json:"id"`
			Options   map[string]string `json:"options"`
			Endpoints int               `json:"endpoints"`
		}
		out := c.ctl(t, "network", "list", "-o", "json")
		if err := json.Unmarshal([]byte(out), &recs); err != nil {
			t.Fatalf("network list -o json: %v\n%s", err, out)
		}
		if len(recs) != 1 || recs[0].ID != netID || recs[0].Options["calico.swarm"] != "true" || recs[0].Endpoints != len(tasks) {
			t.Errorf("network records = %+v; want one, %s, with calico.swarm=true and %d endpoints", recs, netID[:12], len(tasks))
		}
	})

	t.Run("borrowed task addresses are routed by /32", func(t *testing.T) {
		for _, k := range tasks {
			if k.host == mgr {
				continue
			}
			// The worker routes its task locally; everybody else learns
			// the /32 from it, which beats the manager's block.
			if r := k.host.MustExec(t, "ip", "-4", "route", "show", k.ip.String()+"/32"); !regexp.MustCompile(`dev cali[0-9a-f]{11} proto 80 scope link`).MatchString(r) {
				t.Errorf("%s has no local route to its task %v: %q", k.host.Name, k, r)
			}
			for _, o := range c.hosts {
				if o == k.host {
					continue
				}
				want := learnedRoute(k.ip.String(), k.host.IP)
				harness.Eventually(t, 30*time.Second, 250*time.Millisecond, fmt.Sprintf("%s learns %s/32 via %s", o.Name, k.ip, k.host.Name), func() error {
					r := o.MustExec(t, "ip", "-4", "route", "show")
					if !want.MatchString(r) {
						return fmt.Errorf("not yet:\n%s", r)
					}
					return nil
				})
			}
		}
	})

	t.Run("every task pings every other", func(t *testing.T) {
		for _, from := range tasks {
			for _, to := range tasks {
				if from.container != to.container {
					swPing(t, from.host, from.container, to.ip)
				}
			}
		}
	})

	t.Run("DNS names the tasks", func(t *testing.T) {
		// Docker's embedded DNS (service records gossiped between the
		// nodes) answers tasks.<service> with the calico addresses.
		from := tasks[len(tasks)-1]
		harness.Eventually(t, 30*time.Second, 500*time.Millisecond, "nslookup tasks."+swService, func() error {
			out, err := from.host.Docker(t, "exec", from.container, "nslookup", "tasks."+swService)
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			for _, k := range tasks {
				if !regexp.MustCompile(`Address:\s*` + regexp.QuoteMeta(k.ip.String()) + `\b`).MatchString(out) {
					return fmt.Errorf("no %s in:\n%s", k.ip, out)
				}
			}
			return nil
		})
	})

	t.Run("reconcile keeps the manager's addresses", func(t *testing.T) {
		// The VIP (no endpoint anywhere) and the workers' task addresses
		// (assigned by the manager, held by other nodes) are candidates
		// for every node's reconcile by its next pass, and due one
		// --reconcile-grace later: the assertion waits for a pass on
		// every node that started after that.
		want := len(tasks) + 1
		if n := c.usedIPs(t); n != want {
			t.Fatalf("%d addresses assigned, want %d (tasks and VIP)", n, want)
		}
		seen := c.waitReconcilePasses(t, 1)
		const grace = 5 * time.Second // --reconcile-grace above
		harness.Eventually(t, 2*grace, 100*time.Millisecond, "the reconcile grace to pass", func() error {
			if left := time.Until(seen.Add(grace)); left > 0 {
				return fmt.Errorf("%s left", left)
			}
			return nil
		})
		// Two pass starts: the first started after the grace, and has
		// finished when the second starts (passes never overlap).
		c.waitReconcilePasses(t, 2)
		if n := c.usedIPs(t); n != want {
			t.Errorf("%d addresses assigned after the reconcile grace, want still %d: %+v", n, want, c.usage(t))
		}
		for _, h := range c.hosts {
			log, _ := h.pluginLog(t, h.pluginID(t), pluginLogStart[h.Name])
			if m := regexp.MustCompile(`reconcile: (released|removed)[^"\\]*`).FindAllString(log, -1); len(m) > 0 {
				t.Errorf("%s: reconcile acted on the swarm's addresses or endpoints: %q", h.Name, m)
			}
		}
		from := tasks[len(tasks)-1]
		for _, to := range tasks[:len(tasks)-1] {
			swPing(t, from.host, from.container, to.ip)
		}
	})

	t.Run("attachable container on a worker", func(t *testing.T) {
		w := c.hosts[len(c.hosts)-1]
		w.MustDocker(t, "run", "-d", "--name", "att", "--stop-timeout", "1", "--network", swNetwork, harness.Image, "sleep", "3600")
		ip := w.containerIP(t, "att", swNetwork)
		for _, k := range tasks {
			if k.ip.Equal(ip) {
				t.Fatalf("attachable container got %s, the address of task %v", ip, k)
			}
			swPing(t, w, "att", k.ip)
		}
		w.MustDocker(t, "rm", "-f", "att")
	})

	t.Run("manager restart keeps the assignments", func(t *testing.T) {
		// The restarted manager re-requests every address it had
		// assigned (its allocator state is in memory, calico-ipam's in
		// etcd): the same addresses must come back, none twice, none
		// leaked. Its own task restarts (no live-restore) with a new one.
		before := map[string]string{}
		for _, k := range tasks {
			if k.host != mgr {
				before[k.container] = k.ip.String()
			}
		}
		mgr.RestartDockerd(t)
		tasks = c.waitTasks(t, swService, 3, "3 tasks running after the manager restart")
		t.Logf("tasks after the restart: %v", tasks)
		seen := map[string]bool{}
		for _, k := range tasks {
			if seen[k.ip.String()] {
				t.Errorf("task %v: address used twice", k)
			}
			seen[k.ip.String()] = true
			if ip, ok := before[k.container]; ok && ip != k.ip.String() {
				t.Errorf("worker task %v had %s before the manager restart", k, ip)
			}
		}
		if seen[vip.String()] {
			t.Errorf("a task got the VIP %s", vip)
		}
		if n := c.usedIPs(t); n != len(tasks)+1 {
			t.Errorf("%d addresses assigned after the manager restart, want %d (tasks and VIP): %+v", n, len(tasks)+1, c.usage(t))
		}
		for _, from := range tasks {
			for _, to := range tasks {
				if from.container != to.container {
					swPing(t, from.host, from.container, to.ip)
				}
			}
		}
	})

	t.Run("removal releases every address and the network", func(t *testing.T) {
		mgr.MustDocker(t, "service", "rm", swService, "vip")
		c.waitTasks(t, swService, 0, "task containers gone")
		harness.Eventually(t, 60*time.Second, time.Second, "network removed", func() error {
			_, err := mgr.Docker(t, "network", "rm", swNetwork)
			return err
		})
		harness.Eventually(t, 60*time.Second, time.Second, "every address released", func() error {
			if n := c.usedIPs(t); n != 0 {
				return fmt.Errorf("%d addresses still assigned: %+v", n, c.usage(t))
			}
			return nil
		})
		harness.Eventually(t, 30*time.Second, time.Second, "network record freed", func() error {
			out := c.ctl(t, "network", "list", "-o", "json")
			if strings.Contains(out, netID) {
				return fmt.Errorf("record of %s still there:\n%s", netID[:12], out)
			}
			return nil
		})
		for _, h := range c.hosts {
			if links := h.MustExec(t, "ip", "-o", "link", "show"); strings.Contains(links, "cali") {
				t.Errorf("%s: cali veths left:\n%s", h.Name, links)
			}
		}
	})
}

// leaveSwarm takes the services and the swarm down before the plugins go:
// otherwise swarm restarts the tasks the cleanup removes.
func (c *swarmCluster) leaveSwarm(t *testing.T) {
	mgr := c.hosts[0]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if ids, err := mgr.DockerCtx(ctx, "service", "ls", "-q"); err == nil && ids != "" {
		if out, err := mgr.DockerCtx(ctx, append([]string{"service", "rm"}, strings.Fields(ids)...)...); err != nil {
			t.Logf("cleanup: service rm: %v %s", err, out)
		}
	}
	// Workers first, then the manager.
	for _, h := range append(append([]*swarmHost{}, c.hosts[1:]...), mgr) {
		if out, err := h.DockerCtx(ctx, "swarm", "leave", "--force"); err != nil {
			t.Logf("cleanup: %s: swarm leave: %v %s", h.Name, err, out)
		}
	}
}

// reconcilePass is the debug line each reconcile pass starts with, as
// dockerd quotes it in its log.
var reconcilePass = regexp.MustCompile(`msg=\\"reconcile pass\\" `)

// waitReconcilePasses waits until every node's reconcile loop has started
// n passes after the call, and returns when the last node's n-th was seen.
func (c *swarmCluster) waitReconcilePasses(t *testing.T, n int) time.Time {
	t.Helper()
	offsets := map[string]int{}
	for _, h := range c.hosts {
		_, offsets[h.Name] = h.pluginLog(t, h.pluginID(t), 0)
	}
	for _, h := range c.hosts {
		harness.Eventually(t, 30*time.Second, 200*time.Millisecond, h.Name+": reconcile passes", func() error {
			log, _ := h.pluginLog(t, h.pluginID(t), offsets[h.Name])
			if got := len(reconcilePass.FindAllStringIndex(log, -1)); got < n {
				return fmt.Errorf("%d passes started, want %d", got, n)
			}
			return nil
		})
	}
	return time.Now()
}
