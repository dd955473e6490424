package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// calicoHost is one netns host with its dockerd, the busybox image and the
// real calico-cnm daemon on its embedded etcd.
type calicoHost struct {
	*harness.Host
	bin    string
	plugin *harness.Process
}

func newCalicoHost(t *testing.T, name string, env ...string) *calicoHost {
	t.Helper()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	// A host on a fabric has an uplink with a default route, as real hosts
	// do: proxy ARP answers for 169.254.1.1 only when the host has a route
	// to it through another interface (Calico has the same requirement).
	h := harness.NewFabric(t, "").AddHost(t, name, harness.HostOptions{})
	h.ImportBusybox(t)
	p := h.StartPlugin(t, bin, env)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
		}
	})
	return &calicoHost{Host: h, bin: bin, plugin: p}
}

// cli runs the operator CLI inside the host's netns, where the embedded
// etcd listens on 127.0.0.1:2379.
func (h *calicoHost) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return h.Exec(t, append([]string{h.bin}, args...)...)
}

func (h *calicoHost) containerIP(t *testing.T, name, network string) net.IP {
	t.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, network)
	out := h.MustDocker(t, "inspect", "-f", tmpl, name)
	ip := net.ParseIP(strings.TrimSpace(out))
	if ip == nil {
		t.Fatalf("container %s has no IPv4 address on %s (inspect said %q)", name, network, out)
	}
	return ip
}

func (h *calicoHost) hostRoutes(t *testing.T, family string) string {
	t.Helper()
	return h.MustExec(t, "ip", family, "route", "show")
}

func (h *calicoHost) caliLinks(t *testing.T) []string {
	t.Helper()
	out := h.MustExec(t, "ip", "-o", "link", "show")
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], "cali") {
			names = append(names, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	return names
}

type blockUsage struct {
	CIDR string `json:"CIDR"`
	Host string `json:"Host"`
	Used int    `json:"Used"`
}

func (h *calicoHost) usage(t *testing.T) []blockUsage {
	t.Helper()
	out, err := h.cli(t, "ipam", "show", "-o", "json")
	if err != nil {
		t.Fatalf("ipam show: %v\n%s", err, out)
	}
	var u []blockUsage
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatalf("ipam show -o json: %v\n%s", err, out)
	}
	return u
}

func (h *calicoHost) usedIPs(t *testing.T) int {
	n := 0
	for _, b := range h.usage(t) {
		n += b.Used
	}
	return n
}

func blockOf(ip net.IP) string {
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(26, 32)), Mask: net.CIDRMask(26, 32)}).String()
}

// TestSingleHostDocker is the single-host user story with a real dockerd:
// create a calico network, run containers, check their addressing and the
// host's routes, remove them and check nothing is left.
func TestSingleHostDocker(t *testing.T) {
	t.Parallel()
	h := newCalicoHost(t, "single")
	d := func(args ...string) string { return h.MustDocker(t, args...) }

	d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net1")
	d("run", "-d", "--name", "c1", "--net", "net1", harness.Image, "sleep", "3600")
	d("run", "-d", "--name", "c2", "--net", "net1", harness.Image, "sleep", "3600")
	ip1, ip2 := h.containerIP(t, "c1", "net1"), h.containerIP(t, "c2", "net1")
	t.Logf("c1=%s c2=%s", ip1, ip2)
	if ip1.Equal(ip2) {
		t.Fatalf("both containers got %s", ip1)
	}
	block := blockOf(ip1)
	if blockOf(ip2) != block {
		t.Errorf("containers are in different /26 blocks: %s and %s", block, blockOf(ip2))
	}
	var owned bool
	for _, b := range h.usage(t) {
		if b.CIDR == block && b.Host == h.Name && b.Used == 2 {
			owned = true
		}
	}
	if !owned {
		t.Errorf("block %s is not recorded as this host's with 2 addresses used: %+v", block, h.usage(t))
	}

	t.Run("container view", func(t *testing.T) {
		routes := d("exec", "c1", "ip", "route")
		if !strings.Contains(routes, "default via 169.254.1.1 dev eth0") {
			t.Errorf("container routes lack the 169.254.1.1 default:\n%s", routes)
		}
		if mac := strings.TrimSpace(d("exec", "c1", "cat", "/sys/class/net/eth0/address")); mac != "ee:ee:ee:ee:ee:ee" {
			t.Errorf("container MAC = %q, want ee:ee:ee:ee:ee:ee", mac)
		}
		addr := d("exec", "c1", "ip", "-4", "addr", "show", "eth0")
		if !strings.Contains(addr, ip1.String()+"/32") {
			t.Errorf("eth0 should carry %s/32:\n%s", ip1, addr)
		}
		if out, err := h.Docker(t, "exec", "c1", "ping", "-c", "2", "-W", "2", ip2.String()); err != nil {
			t.Errorf("c1 cannot ping c2 (%s): %v\n%s", ip2, err, out)
		}
		if out, err := h.Docker(t, "exec", "c2", "ping", "-c", "2", "-W", "2", ip1.String()); err != nil {
			t.Errorf("c2 cannot ping c1 (%s): %v\n%s", ip1, err, out)
		}
	})

	t.Run("host routes", func(t *testing.T) {
		routes := h.hostRoutes(t, "-4")
		if !regexp.MustCompile(`(?m)^blackhole ` + regexp.QuoteMeta(block) + ` proto 80`).MatchString(routes) {
			t.Errorf("no blackhole route for block %s:\n%s", block, routes)
		}
		for _, ip := range []net.IP{ip1, ip2} {
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip.String()) + ` dev cali[0-9a-f]{11} proto 80 scope link`)
			if !re.MatchString(routes) {
				t.Errorf("no /32 scope link route via a cali veth for %s:\n%s", ip, routes)
			}
		}
		if n := len(h.caliLinks(t)); n != 2 {
			t.Errorf("host has %d cali veths, want 2: %v", n, h.caliLinks(t))
		}
	})

	t.Run("specific ip", func(t *testing.T) {
		d("run", "-d", "--name", "c3", "--net", "net1", "--ip", "192.168.0.77", harness.Image, "sleep", "3600")
		if ip := h.containerIP(t, "c3", "net1"); ip.String() != "192.168.0.77" {
			t.Fatalf("--ip 192.168.0.77 gave %s", ip)
		}
		out, err := h.Docker(t, "run", "-d", "--name", "c3dup", "--net", "net1", "--ip", "192.168.0.77", harness.Image, "sleep", "3600")
		if err == nil {
			t.Fatalf("a second container got 192.168.0.77 too: %s", out)
		}
		if !strings.Contains(out+err.Error(), "in use") {
			t.Errorf("conflict error does not say the address is in use: %v", err)
		}
		h.Docker(t, "rm", "-f", "c3dup")
		out, err = h.Docker(t, "run", "-d", "--name", "c3out", "--net", "net1", "--ip", "10.1.2.3", harness.Image, "sleep", "3600")
		if err == nil {
			t.Errorf("an address outside the network's subnet was accepted: %s", out)
		}
		h.Docker(t, "rm", "-f", "c3out")
	})

	t.Run("remove releases everything", func(t *testing.T) {
		before := h.usedIPs(t)
		d("rm", "-f", "c2")
		if after := h.usedIPs(t); after != before-1 {
			t.Errorf("used addresses %d -> %d after docker rm, want one fewer", before, after)
		}
		routes := h.hostRoutes(t, "-4")
		if strings.Contains(routes, ip2.String()+" dev cali") {
			t.Errorf("route for removed container %s is still there:\n%s", ip2, routes)
		}
		// The released address is free again: a container can take it.
		d("run", "-d", "--name", "c2again", "--net", "net1", "--ip", ip2.String(), harness.Image, "sleep", "3600")
		if ip := h.containerIP(t, "c2again", "net1"); !ip.Equal(ip2) {
			t.Errorf("re-using released %s gave %s", ip2, ip)
		}
		for _, c := range []string{"c1", "c2again", "c3"} {
			d("rm", "-f", c)
		}
		if n := h.usedIPs(t); n != 0 {
			t.Errorf("%d addresses still allocated after removing every container", n)
		}
		if links := h.caliLinks(t); len(links) != 0 {
			t.Errorf("cali veths left: %v", links)
		}
		if routes := h.hostRoutes(t, "-4"); regexp.MustCompile(`(?m)^192\.168\.\S+ dev cali`).MatchString(routes) {
			t.Errorf("/32 routes left:\n%s", routes)
		}
		d("network", "rm", "net1")
		if out := d("network", "ls", "--filter", "name=net1", "-q"); out != "" {
			t.Errorf("net1 still listed: %s", out)
		}
	})

	t.Run("default pool", func(t *testing.T) {
		d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "net2")
		d("run", "-d", "--name", "d1", "--net", "net2", harness.Image, "sleep", "3600")
		d("run", "-d", "--name", "d2", "--net", "net2", harness.Image, "sleep", "3600")
		ip := h.containerIP(t, "d1", "net2")
		_, pool, _ := net.ParseCIDR("192.168.0.0/16")
		if !pool.Contains(ip) {
			t.Errorf("container on a network without --subnet got %s, outside the default pool %s", ip, pool)
		}
		if out, err := h.Docker(t, "exec", "d2", "ping", "-c", "1", "-W", "2", ip.String()); err != nil {
			t.Errorf("d2 cannot ping d1: %v\n%s", err, out)
		}
		d("rm", "-f", "d1", "d2")
		d("network", "rm", "net2")
	})

	t.Run("ipv6", func(t *testing.T) {
		if out, err := h.cli(t, "pool", "add", "fd00:cafe::/64"); err != nil {
			t.Fatalf("pool add: %v\n%s", err, out)
		}
		d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--ipv6", "--subnet", "fd00:cafe::/64", "net6")
		d("run", "-d", "--name", "v1", "--net", "net6", harness.Image, "sleep", "3600")
		d("run", "-d", "--name", "v2", "--net", "net6", harness.Image, "sleep", "3600")
		tmpl := `{{(index .NetworkSettings.Networks "net6").GlobalIPv6Address}}`
		ip1 := net.ParseIP(d("inspect", "-f", tmpl, "v1"))
		ip2 := net.ParseIP(d("inspect", "-f", tmpl, "v2"))
		_, pool, _ := net.ParseCIDR("fd00:cafe::/64")
		if ip1 == nil || ip2 == nil || !pool.Contains(ip1) || !pool.Contains(ip2) {
			t.Fatalf("IPv6 addresses %v %v not in %s", ip1, ip2, pool)
		}
		routes := d("exec", "v1", "ip", "-6", "route")
		if !strings.Contains(routes, "default via fe80::1 dev eth0") {
			t.Errorf("container IPv6 routes lack default via fe80::1:\n%s", routes)
		}
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ip1.String()) + ` dev cali[0-9a-f]{11} proto 80`).MatchString(h.hostRoutes(t, "-6")) {
			t.Errorf("no /128 host route for %s:\n%s", ip1, h.hostRoutes(t, "-6"))
		}
		var pingErr error
		// IPv6 neighbour discovery on a new veth can take a moment.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, pingErr = h.Docker(t, "exec", "v1", "ping", "-6", "-c", "1", "-W", "1", ip2.String()); pingErr == nil {
				break
			}
		}
		if pingErr != nil {
			t.Errorf("v1 cannot ping6 v2 (%s): %v", ip2, pingErr)
		}
		d("rm", "-f", "v1", "v2")
		d("network", "rm", "net6")
		if links := h.caliLinks(t); len(links) != 0 {
			t.Errorf("cali veths left: %v", links)
		}
	})
}

// TestDockerShowsPluginErrors checks that bad requests reach the user as a
// sentence from the plugin, and leave nothing behind.
func TestDockerShowsPluginErrors(t *testing.T) {
	t.Parallel()
	h := newCalicoHost(t, "errors")
	out, err := h.Docker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "10.77.0.0/16", "nopool")
	if err == nil {
		t.Fatalf("network on a subnet outside every calico pool was created: %s", out)
	}
	if !strings.Contains(err.Error(), "pool") {
		t.Errorf("error does not mention the pool: %v", err)
	}
	out, err = h.Docker(t, "network", "create", "--driver", "calico", "--subnet", "10.78.0.0/16", "wrongipam")
	if err == nil {
		t.Fatalf("calico network with Docker's default IPAM was created: %s", out)
	}
	if !strings.Contains(err.Error(), "calico-ipam") {
		t.Errorf("error does not tell the user to use calico-ipam: %v", err)
	}
	// With the opt-in option the pool is created for the subnet.
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--ipam-opt", "calico.create-pool=true", "--subnet", "10.77.0.0/24", "withpool")
	h.MustDocker(t, "run", "-d", "--name", "w1", "--net", "withpool", harness.Image, "sleep", "3600")
	if ip := h.containerIP(t, "w1", "withpool"); !strings.HasPrefix(ip.String(), "10.77.0.") {
		t.Errorf("container on the created pool got %s", ip)
	}
	h.MustDocker(t, "rm", "-f", "w1")
	if n := h.usedIPs(t); n != 0 {
		t.Errorf("%d addresses still allocated", n)
	}
}

// TestDaemonSocketsLifecycle: the sockets are 0660, a clean SIGTERM exits 0
// and removes them, and a restart over stale socket files (left by kill -9)
// serves again.
func TestDaemonSocketsLifecycle(t *testing.T) {
	t.Parallel()
	h := newCalicoHost(t, "sockets")
	socks := []string{filepath.Join(h.PluginDir, "calico.sock"), filepath.Join(h.PluginDir, "calico-ipam.sock")}
	for _, s := range socks {
		fi, err := os.Stat(s)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: mode %v, want a socket with 0660", s, fi.Mode())
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			t.Errorf("%s is not owned by root", s)
		}
	}
	if err := h.plugin.Stop(t); err != nil {
		t.Errorf("daemon exited with %v after SIGTERM, want status 0", err)
	}
	for _, s := range socks {
		if _, err := os.Stat(s); !os.IsNotExist(err) {
			t.Errorf("%s still exists after a clean exit (%v)", s, err)
		}
	}
	h.plugin.Start(t)
	h.plugin.Kill9(t)
	for _, s := range socks {
		if _, err := os.Stat(s); err != nil {
			t.Fatalf("kill -9 should leave the stale socket %s behind: %v", s, err)
		}
	}
	h.plugin.Start(t) // waits until both sockets answer Plugin.Activate
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "n1")
	h.MustDocker(t, "run", "--rm", "--net", "n1", harness.Image, "true")
}
