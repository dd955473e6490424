package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/routing"
)

type nodeRow struct {
	Name      string
	Alive     bool
	Blocks    int
	Addresses int
	Endpoints int
	Version   string
	LastSeen  *time.Time
	Routing   *datastore.RoutingSummary
	Problems  []string
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

// TestNodeDecommission: the two ways a host leaves a live cluster of
// three (a, b, c).
//
// b dies for good (kill -9 of its dockerd and daemon: nothing is cleaned
// up, and graceful restart keeps its routes on the other hosts for the
// restart time). Its lease still holds for its TTL, so `node delete b` is
// refused; `node delete b --force` removes its endpoint records, address
// and block, and its node record at once, so a drops the BGP session and
// b's block route at once instead of after the graceful-restart time; a
// keeps working and reaches c.
//
// c is decommissioned as docs/datastore.md says: its containers drained,
// its daemon stopped (which gives up its lease at once: `node list -o
// wide` flags it down), then `node delete c` without --force: its block
// goes back to the pool, a drops its route and its session, and a's next
// containers still get addresses.
func TestNodeDecommission(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	hc := c.addHost(t, "c")
	ipB := b.run(t, "b1")
	blkB := blockOf26(ipB)
	a.waitRoute(t, blkB, b.IP, true, 30*time.Second)

	nodes := c.nodeList(t)
	for _, n := range []string{"a", "b", "c"} {
		if !nodes[n].Alive || nodes[n].Version == "" || nodes[n].LastSeen == nil {
			t.Fatalf("node %s not shown up with its version and heartbeat: %+v", n, nodes[n])
		}
	}
	if nb := nodes["b"]; nb.Blocks != 1 || nb.Addresses != 1 || nb.Endpoints != 1 {
		t.Errorf("node list for b = %+v, want 1 block, 1 address, 1 endpoint", nb)
	}
	if out, err := c.ctl(t, "node", "delete", "b"); err == nil || !strings.Contains(fmt.Sprint(err)+out, "holds its liveness lease; stop it first") {
		t.Fatalf("node delete of a running node: err %v, output:\n%s", err, out)
	}

	// b dies and never comes back.
	b.Dockerd().Kill9(t)
	b.plugin.Kill9(t)
	// Its lease outlives it (datastore.DefaultAliveTTL): refused still.
	if out, err := c.ctl(t, "node", "delete", "b"); err == nil || !strings.Contains(fmt.Sprint(err)+out, "or pass --force if that host is gone") {
		t.Fatalf("node delete of a dead node whose lease holds: err %v, output:\n%s", err, out)
	}
	// Graceful restart: a still routes b's block (stale) meanwhile.
	a.waitRoute(t, blkB, b.IP, true, time.Second)

	out := c.mustCtl(t, "node", "delete", "b", "--force")
	t.Logf("node delete b --force: %s", strings.TrimSpace(out))
	if !strings.Contains(out, "deleted node b: 1 endpoint records, 1 addresses released, 1 blocks released") {
		t.Errorf("node delete b said:\n%s", out)
	}
	deleted := time.Now()
	a.waitRoute(t, blkB, b.IP, false, 15*time.Second)
	t.Logf("b's block route left a %s after node delete (graceful restart alone would keep it %s)", time.Since(deleted).Round(100*time.Millisecond), "120s")
	a.waitPeers(t, map[string]routing.PeerType{hc.IP.String(): routing.PeerMesh}, 15*time.Second)

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
	ipC := hc.run(t, "c1")
	blkC := blockOf26(ipC)
	a.waitRoute(t, blkC, hc.IP, true, 30*time.Second)
	a.ping(t, "a1", ipC)
	t.Logf("a1=%s reaches c1=%s after b was deleted", ipA, ipC)

	// c is decommissioned: drain, stop, delete.
	hc.MustDocker(t, "rm", "-f", "c1")
	if err := hc.plugin.Stop(t); err != nil {
		t.Fatalf("stopping c's daemon: %v", err)
	}
	// A clean stop gives the lease up at once: no --force needed.
	nc := c.nodeList(t)["c"]
	if nc.Alive || len(nc.Problems) == 0 || !strings.HasPrefix(nc.Problems[0], "daemon down") {
		t.Fatalf("node list after c's daemon stopped: %+v; want down, flagged", nc)
	}
	out = c.mustCtl(t, "node", "delete", "c")
	t.Logf("node delete c: %s", strings.TrimSpace(out))
	a.waitRoute(t, blkC, hc.IP, false, 15*time.Second)
	a.waitPeers(t, map[string]routing.PeerType{}, 15*time.Second)
	if u := c.mustCtl(t, "ipam", "show"); strings.Contains(u, blkC) {
		t.Errorf("c's block %s still in ipam show after node delete:\n%s", blkC, u)
	}
	if nodes := c.nodeList(t); len(nodes) != 1 || !nodes["a"].Alive {
		t.Errorf("node list after both deletes: %+v; want a alone", nodes)
	}
	ipA2 := a.run(t, "a2")
	a.ping(t, "a2", ipA)
	t.Logf("a2=%s after c's decommission", ipA2)
}
