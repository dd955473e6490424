package e2e

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestMultiHostTopologySwitch: containers on hosts a and b ping each other
// continuously while the cluster goes from the node-to-node mesh to two
// route reflectors (r1, r2: daemons without dockerd) and back. Make before
// break: not one ping is lost, and each host ends with exactly the sessions
// of the new topology.
func TestMultiHostTopologySwitch(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	r1, r2 := c.addDaemonOnlyHost(t, "r1"), c.addDaemonOnlyHost(t, "r2")
	ipA, ipB := a.run(t, "a1"), b.run(t, "b1")
	blkA, blkB := blockOf26(ipA), blockOf26(ipB)
	a.waitRoute(t, blkB, b.IP, true, 30*time.Second)
	b.waitRoute(t, blkA, a.IP, true, 30*time.Second)

	meshOf := func(h *bgpHost) map[string]routing.PeerType {
		want := map[string]routing.PeerType{}
		for _, o := range []*bgpHost{a, b, r1, r2} {
			if o != h {
				want[o.IP.String()] = routing.PeerMesh
			}
		}
		return want
	}
	reflectors := map[string]routing.PeerType{r1.IP.String(): routing.PeerReflector, r2.IP.String(): routing.PeerReflector}
	for _, h := range []*bgpHost{a, b} {
		h.waitPeers(t, meshOf(h), 30*time.Second)
	}
	// The reflector flag alone changes nothing while the mesh is on.
	for _, r := range []*bgpHost{r1, r2} {
		c.mustCtl(t, "bgp", "config", "--node", r.Name, "--route-reflector=true", "--cluster-id", "1.0.0.1")
	}

	pings := []*continuousPing{startPing(t, a, "a1", ipB), startPing(t, b, "b1", ipA)}

	c.mustCtl(t, "bgp", "config", "--mesh", "off")
	start := time.Now()
	for _, h := range []*bgpHost{a, b} {
		h.waitPeers(t, reflectors, 60*time.Second)
	}
	t.Logf("mesh -> reflectors: a and b have only their reflector sessions after %s", time.Since(start).Round(time.Millisecond))
	a.waitRoute(t, blkB, b.IP, true, 10*time.Second)
	b.waitRoute(t, blkA, a.IP, true, 10*time.Second)
	for _, p := range pings {
		p.waitReplies(t, 10) // over the reflected routes alone
	}

	c.mustCtl(t, "bgp", "config", "--mesh", "on")
	start = time.Now()
	for _, h := range []*bgpHost{a, b} {
		h.waitPeers(t, meshOf(h), 60*time.Second)
	}
	t.Logf("reflectors -> mesh: mesh sessions established after %s", time.Since(start).Round(time.Millisecond))
	for _, p := range pings {
		p.waitReplies(t, 10) // and over the mesh again
	}

	for _, p := range pings {
		tx, lost := p.stop(t)
		t.Logf("%s: %d pings sent across both switches, lost (sequence numbers): %v", p.name, tx, lost)
		if tx < 20 || len(lost) > 0 {
			t.Errorf("%s lost %d of %d pings during the topology switches: %v", p.name, len(lost), tx, lost)
		}
	}
	for _, h := range []*bgpHost{a, b, r1, r2} {
		log := h.plugin.Log()
		// Quiet when things work: gobgp's listener used to warn at every start.
		for _, unwanted := range []string{"learned route withdrawn", "cannot set TTL", "restart flag is not set"} {
			if strings.Contains(log, unwanted) {
				t.Errorf("%s logged %q during the switches:\n%s", h.Name, unwanted, grepLines(log, unwanted))
			}
		}
	}
}

// addDaemonOnlyHost is a host with calico-cnm (BGP on, the cluster's
// settings) and no dockerd: a route reflector, say.
func (c *bgpCluster) addDaemonOnlyHost(t *testing.T, name string) *bgpHost {
	t.Helper()
	h := &bgpHost{Host: c.fabric.AddHost(t, name, harness.HostOptions{NoDockerd: true}), c: c}
	env := []string{"ETCD_ENDPOINTS=" + c.etcd}
	h.plugin = h.StartPlugin(t, c.bin, env, append(h.ServeArgs(env), "--bgp", "--resync-interval", "2s", "--bgp-sync-timeout", "20s")...)
	return h
}

// continuousPing is `ping -i 0.2` in a container until stop.
type continuousPing struct {
	name string
	h    *bgpHost
	ctr  string
}

func startPing(t *testing.T, h *bgpHost, ctr string, to net.IP) *continuousPing {
	t.Helper()
	h.MustDocker(t, "exec", "-d", ctr, "sh", "-c", "exec ping -i 0.2 "+to.String()+" >/tmp/ping.log 2>&1")
	p := &continuousPing{name: fmt.Sprintf("%s -> %s", ctr, to), h: h, ctr: ctr}
	harness.Eventually(t, 10*time.Second, 100*time.Millisecond, p.name+" running", func() error {
		out, err := h.Docker(t, "exec", ctr, "cat", "/tmp/ping.log")
		if err != nil || !strings.Contains(out, "seq=") {
			return fmt.Errorf("no reply yet: %v %s", err, out)
		}
		return nil
	})
	return p
}

// waitReplies waits until n more replies than now are in the log.
func (p *continuousPing) waitReplies(t *testing.T, n int) {
	t.Helper()
	replies := func() int {
		out, _ := p.h.Docker(t, "exec", p.ctr, "cat", "/tmp/ping.log")
		return strings.Count(out, "seq=")
	}
	want := replies() + n
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, fmt.Sprintf("%s: %d more replies", p.name, n), func() error {
		if got := replies(); got < want {
			return fmt.Errorf("%d replies, want %d", got, want)
		}
		return nil
	})
}

// stop interrupts ping (busybox prints its statistics on SIGINT) and
// returns how many were sent and the sequence numbers lost.
func (p *continuousPing) stop(t *testing.T) (tx int, lost []int) {
	t.Helper()
	p.h.MustDocker(t, "exec", p.ctr, "sh", "-c", "kill -INT $(pidof ping)")
	harness.Eventually(t, 10*time.Second, 100*time.Millisecond, p.name+" statistics", func() error {
		out, _ := p.h.Docker(t, "exec", p.ctr, "cat", "/tmp/ping.log")
		var ok bool
		if tx, lost, ok = pingOutcome(out); !ok {
			return fmt.Errorf("no statistics yet:\n%s", out)
		}
		return nil
	})
	return tx, lost
}

var (
	pingStatistics = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)
	pingReply      = regexp.MustCompile(`seq=(\d+) `)
)

// pingOutcome reads the log of a busybox ping stopped with SIGINT: how
// many it sent, and the sequence numbers that got no answer although a
// later one did. The last ones may still have been on their way at the
// SIGINT, which the statistics count as lost; ok is false until the
// statistics are in the log.
func pingOutcome(log string) (tx int, lost []int, ok bool) {
	m := pingStatistics.FindStringSubmatch(log)
	if m == nil {
		return 0, nil, false
	}
	tx, _ = strconv.Atoi(m[1])
	answered := map[int]bool{}
	last := -1
	for _, m := range pingReply.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		answered[n] = true
		last = max(last, n)
	}
	for n := 0; n < last; n++ {
		if !answered[n] {
			lost = append(lost, n)
		}
	}
	return tx, lost, true
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
