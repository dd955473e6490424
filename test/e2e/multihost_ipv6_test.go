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

// TestMultiHostIPv6: on a dual-stack fabric each node registers an IPv6 next
// hop next to its IPv4 BGP address, advertises its IPv6 blocks over the
// same sessions, and installs the others' as `<block> via <node IPv6> proto
// 81`: containers on different hosts reach each other over IPv6. When the
// last container of a block goes, the block's route goes everywhere.
func TestMultiHostIPv6(t *testing.T) {
	t.Parallel()
	const pool6 = "fd00:beef::/64"
	c := newBGPCluster(t)
	c.fabric.EnableIPv6(t)
	c.mustCtl(t, "pool", "add", pool6)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	for _, h := range []*bgpHost{a, b} {
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--ipv6", "--subnet", pool6, "net6")
	}
	run6 := func(h *bgpHost, name string) net.IP {
		t.Helper()
		h.MustDocker(t, "run", "-d", "--name", name, "--net", "net6", harness.Image, "sleep", "3600")
		ip := net.ParseIP(h.MustDocker(t, "inspect", "-f", `{{(index .NetworkSettings.Networks "net6").GlobalIPv6Address}}`, name))
		if ip == nil || ip.To4() != nil {
			t.Fatalf("%s: container %s has no IPv6 address", h.Name, name)
		}
		return ip
	}
	ipA, ipB := run6(a, "a6"), run6(b, "b6")
	blockOf122 := func(ip net.IP) string {
		return (&net.IPNet{IP: ip.Mask(net.CIDRMask(122, 128)), Mask: net.CIDRMask(122, 128)}).String()
	}
	blkA, blkB := blockOf122(ipA), blockOf122(ipB)
	t.Logf("a6=%s (block %s) b6=%s (block %s); hosts a=%s b=%s", ipA, blkA, ipB, blkB, a.IP6, b.IP6)
	if blkA == blkB {
		t.Fatalf("hosts share an IPv6 block %s", blkA)
	}

	nodes := c.mustCtl(t, "node", "list", "-o", "json")
	for _, h := range []*bgpHost{a, b} {
		if !strings.Contains(nodes, fmt.Sprintf("%q", h.IP6.String())) {
			t.Errorf("node %s's record lacks its IPv6 next hop %s:\n%s", h.Name, h.IP6, nodes)
		}
	}

	waitRoute6 := func(h *bgpHost, dst string, via net.IP, present bool) {
		t.Helper()
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(dst) + ` via ` + regexp.QuoteMeta(via.String()) + ` dev eth0 proto 81\b`)
		any := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(dst) + ` `)
		harness.Eventually(t, 30*time.Second, 100*time.Millisecond, fmt.Sprintf("%s: IPv6 route %s via %s present=%v", h.Name, dst, via, present), func() error {
			r := h.MustExec(t, "ip", "-6", "route", "show")
			if present && !re.MatchString(r) {
				return fmt.Errorf("not yet:\n%s", r)
			}
			if !present && any.MatchString(r) {
				return fmt.Errorf("still there:\n%s", r)
			}
			return nil
		})
	}
	start := time.Now()
	waitRoute6(a, blkB, b.IP6, true)
	waitRoute6(b, blkA, a.IP6, true)
	t.Logf("IPv6 blocks routed both ways %s after the containers started", time.Since(start).Round(time.Millisecond))

	for _, tc := range []struct {
		h        *bgpHost
		from     string
		to       net.IP
		fromHost string
	}{{a, "a6", ipB, "a"}, {b, "b6", ipA, "b"}} {
		var out string
		var err error
		// Neighbour discovery on the fabric and the new veths may take a moment.
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if out, err = tc.h.Docker(t, "exec", tc.from, "ping", "-6", "-c", "1", "-W", "1", tc.to.String()); err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("%s (on %s) cannot ping6 %s across hosts: %v\n%s", tc.from, tc.fromHost, tc.to, err, out)
		}
	}

	// b's only IPv6 container goes: its block is released (grace 1s) and
	// withdrawn; a removes the route.
	b.MustDocker(t, "rm", "-f", "b6")
	waitRoute6(a, blkB, b.IP6, false)
}
