package e2e

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// ipOn is the address of container name on network.
func ipOn(t *testing.T, h *harness.Host, name, network string) net.IP {
	t.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, network)
	ip := net.ParseIP(strings.TrimSpace(h.MustDocker(t, "inspect", "-f", tmpl, name)))
	if ip == nil {
		t.Fatalf("%s: container %s has no address on %s", h.Name, name, network)
	}
	return ip
}

// defaultRoutes lists the default routes inside a container.
func defaultRoutes(t *testing.T, h *harness.Host, name string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(h.MustDocker(t, "exec", name, "ip", "-4", "route", "show"), "\n") {
		if strings.HasPrefix(l, "default") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// noPing asserts that from cannot ping to (two tries, each waiting 1 s
// for the answer).
func noPing(t *testing.T, h *harness.Host, from string, to net.IP, what string) {
	t.Helper()
	for i := 0; i < 2; i++ {
		if out, err := h.Docker(t, "exec", from, "ping", "-c", "1", "-W", "1", to.String()); err == nil {
			t.Errorf("%s: %s reaches %s:\n%s", what, from, to, out)
			return
		}
	}
}

// TestSeveralNetworksPerContainer: a container on two calico networks
// (docker network connect) reaches a peer of each on another host, keeps
// the other side after a disconnect, and has one default route throughout;
// a container on a bridge network connected to a calico network reaches
// its calico peers; isolation holds per interface.
func TestSeveralNetworksPerContainer(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "mnA"), c.addHost(t, "mnB")
	nets := map[string]string{"front": "192.168.10.0/24", "back": "192.168.20.0/24"}
	for _, h := range []*bgpHost{a, b} {
		for name, subnet := range nets {
			h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", subnet, name)
		}
	}
	b.MustDocker(t, "run", "-d", "--name", "pf", "--net", "front", harness.Image, "sleep", "3600")
	b.MustDocker(t, "run", "-d", "--name", "pb", "--net", "back", harness.Image, "sleep", "3600")
	pf, pb := ipOn(t, b.Host, "pf", "front"), ipOn(t, b.Host, "pb", "back")

	a.MustDocker(t, "run", "-d", "--name", "cc", "--net", "front", harness.Image, "sleep", "3600")
	a.ping(t, "cc", pf)

	a.MustDocker(t, "network", "connect", "back", "cc")
	cFront, cBack := ipOn(t, a.Host, "cc", "front"), ipOn(t, a.Host, "cc", "back")
	a.ping(t, "cc", pb)
	a.ping(t, "cc", pf)
	routes := a.MustDocker(t, "exec", "cc", "ip", "-4", "route", "show")
	if d := defaultRoutes(t, a.Host, "cc"); len(d) != 1 {
		t.Errorf("c on two networks has default routes %q, want one:\n%s", d, routes)
	}
	for _, want := range []string{`192.168.10.0/24 via 169.254.1.\d dev eth`, `192.168.20.0/24 via 169.254.1.\d dev eth`} {
		if !regexp.MustCompile(want).MatchString(routes) {
			t.Errorf("c's routes lack %q:\n%s", want, routes)
		}
	}
	// Isolation per interface: pb (back) reaches c's back address only.
	b.ping(t, "pb", cBack)
	noPing(t, b.Host, "pb", cFront, "back peer to c's front address")

	a.MustDocker(t, "network", "disconnect", "front", "cc")
	a.ping(t, "cc", pb)
	noPing(t, a.Host, "cc", pf, "after disconnecting front")
	if d := defaultRoutes(t, a.Host, "cc"); len(d) != 1 || !strings.Contains(d[0], "169.254.1.2") {
		t.Errorf("after disconnecting front, c's default routes are %q, want one via back's gateway 169.254.1.2", d)
	}
	// Connecting again takes the free first gateway; both sides work.
	a.MustDocker(t, "network", "connect", "front", "cc")
	a.ping(t, "cc", pf)
	a.ping(t, "cc", pb)
	if d := defaultRoutes(t, a.Host, "cc"); len(d) != 1 {
		t.Errorf("after reconnecting front, c has default routes %q, want one", d)
	}

	// Docker's bridge holds the default route ("br" sorts before "front");
	// the calico interface routes the network's subnet.
	a.MustDocker(t, "network", "create", "--driver", "bridge", "--subnet", "10.77.0.0/24", "br")
	a.MustDocker(t, "run", "-d", "--name", "dd", "--net", "br", harness.Image, "sleep", "3600")
	a.MustDocker(t, "network", "connect", "front", "dd")
	if d := defaultRoutes(t, a.Host, "dd"); len(d) != 1 || !strings.Contains(d[0], "10.77.0.1") {
		t.Errorf("d's default routes %q, want one via the bridge 10.77.0.1", d)
	}
	a.ping(t, "dd", pf)
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "pf pings d's front address", func() error {
		out, err := b.Docker(t, "exec", "pf", "ping", "-c", "1", "-W", "1", ipOn(t, a.Host, "dd", "front").String())
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}
