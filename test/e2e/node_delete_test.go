package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/routing"
)

type nodeRow struct {
	Name      string
	Alive     bool
	Blocks    int
	Addresses int
	Endpoints int
}

func (c *bgpCluster) nodeList(t *testing.T) map[string]nodeRow {
	t.Helper()
	var rows []nodeRow
	out := c.mustCtl(t, "node", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("node list -o json: %v\n%s", err, out)
	}
	m := map[string]nodeRow{}
	for _, r := range rows {
		m[r.Name] = r
	}
	return m
}

// TestNodeDecommission: host b dies for good (kill -9 of its dockerd and
// daemon: nothing is cleaned up, and graceful restart keeps its routes on
// the other hosts for the restart time). `node list` shows it down once its
// lease expires; `node delete b` - refused while b was up - then removes
// its endpoint records, address and block, and its node record, so host a
// drops the BGP session and b's block route at once instead of after the
// graceful-restart time; a keeps working.
func TestNodeDecommission(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	c.addHost(t, "c") // a bystander: its routes and records must stay
	ipB := b.run(t, "b1")
	blkB := blockOf26(ipB)
	a.waitRoute(t, blkB, b.IP, true, 30*time.Second)

	nodes := c.nodeList(t)
	for _, n := range []string{"a", "b", "c"} {
		if !nodes[n].Alive {
			t.Fatalf("node %s not shown up: %+v", n, nodes)
		}
	}
	if nb := nodes["b"]; nb.Blocks != 1 || nb.Addresses != 1 || nb.Endpoints != 1 {
		t.Errorf("node list for b = %+v, want 1 block, 1 address, 1 endpoint", nb)
	}
	if out, err := c.ctl(t, "node", "delete", "b"); err == nil || !strings.Contains(fmt.Sprint(err)+out, "holds its liveness lease; stop it first") {
		t.Fatalf("node delete of a running node: err %v, output:\n%s", err, out)
	}

	b.Dockerd().Kill9(t)
	b.plugin.Kill9(t)
	died := time.Now()
	var down time.Duration
	deadline := time.Now().Add(60 * time.Second)
	for {
		if !c.nodeList(t)["b"].Alive {
			down = time.Since(died)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b still shown up 60s after its daemon died")
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("b shown down %s after its daemon was killed", down.Round(100*time.Millisecond))
	// Graceful restart: a still routes b's block (stale) meanwhile.
	a.waitRoute(t, blkB, b.IP, true, time.Second)

	out := c.mustCtl(t, "node", "delete", "b")
	t.Logf("node delete b: %s", strings.TrimSpace(out))
	if !strings.Contains(out, "deleted node b: 1 endpoint records, 1 addresses released, 1 blocks released") {
		t.Errorf("node delete b said:\n%s", out)
	}
	deleted := time.Now()
	a.waitRoute(t, blkB, b.IP, false, 15*time.Second)
	t.Logf("b's block route left a %s after node delete (graceful restart alone would keep it %s)", time.Since(deleted).Round(100*time.Millisecond), "120s")
	a.waitPeers(t, map[string]routing.PeerType{c.hosts[2].IP.String(): routing.PeerMesh}, 15*time.Second)

	nodes = c.nodeList(t)
	if _, ok := nodes["b"]; ok || len(nodes) != 2 {
		t.Errorf("node list after delete: %+v", nodes)
	}
	if u := fmt.Sprint(c.mustCtl(t, "ipam", "show")); strings.Contains(u, blkB) {
		t.Errorf("b's block %s still in ipam show:\n%s", blkB, u)
	}
	if out, err := c.ctl(t, "ipam", "check"); err != nil {
		t.Errorf("ipam check after node delete: %v\n%s", err, out)
	}
	// a still works, and reaches c.
	ipA := a.run(t, "a1")
	ipC := c.hosts[2].run(t, "c1")
	a.waitRoute(t, blockOf26(ipC), c.hosts[2].IP, true, 30*time.Second)
	a.ping(t, "a1", ipC)
	t.Logf("a1=%s reaches c1=%s after b was deleted", ipA, ipC)
}
