package e2e

import (
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/ports"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestInternalNetwork: containers of a `--internal` calico network reach
// each other across two hosts, have no default route, and cannot reach a
// host outside the pools that a container of an ordinary network reaches.
func TestInternalNetwork(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "inA"), c.addHost(t, "inB")
	outside := c.fabric.AddHost(t, "inOut", harness.HostOptions{NoDockerd: true})
	for _, h := range []*bgpHost{a, b} {
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--internal", "--subnet", "192.168.40.0/24", "inet")
	}
	a.MustDocker(t, "run", "-d", "--name", "i1", "--net", "inet", harness.Image, "sleep", "3600")
	b.MustDocker(t, "run", "-d", "--name", "i2", "--net", "inet", harness.Image, "sleep", "3600")
	a.ping(t, "i1", ipOn(t, b.Host, "i2", "inet"))
	b.ping(t, "i2", ipOn(t, a.Host, "i1", "inet"))
	if d := defaultRoutes(t, a.Host, "i1"); len(d) != 0 {
		t.Errorf("i1 on an internal network has default routes %q", d)
	}
	// The outside host (which routes the pool back through host A, so
	// no NAT is needed) answers an ordinary network's container...
	outside.MustExec(t, "ip", "route", "add", "192.168.0.0/16", "via", a.IP.String())
	a.run(t, "ordinary")
	a.ping(t, "ordinary", outside.IP)
	// ... and not the internal one's.
	noPing(t, a.Host, "i1", outside.IP, "internal network to a host outside the pools")
	noPing(t, a.Host, "i1", a.IP, "internal network to its own host's address")

	// A container that adds its own default route (it has NET_ADMIN)
	// still reaches its peers and still not the outside: the nftables
	// guard drops it.
	a.MustDocker(t, "run", "-d", "--name", "i3", "--cap-add", "NET_ADMIN", "--net", "inet", harness.Image, "sleep", "3600")
	a.MustDocker(t, "exec", "i3", "ip", "route", "add", "default", "via", "169.254.1.1")
	a.ping(t, "i3", ipOn(t, b.Host, "i2", "inet"))
	noPing(t, a.Host, "i3", outside.IP, "internal network with a default route of its own to a host outside the pools")
	if tbl := a.MustExec(t, "nft", "list", "chain", "ip", ports.TableName, "internal"); !strings.Contains(tbl, "outside the pools") {
		t.Errorf("no guard rule for the internal network's interfaces:\n%s", tbl)
	}
}
