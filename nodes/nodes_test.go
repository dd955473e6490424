package nodes_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nodes"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// cluster: nodes "gone" and "stays" share one etcd. "gone" owns the only
// block of pool 10.1.0.0/26, where "stays" borrows an address; "gone" also
// has an empty block in 10.2.0.0/26 (kept by the grace period), one
// endpoint, one swarm-assigned address, a node record and a BGP peer of its
// own, and a VXLAN tunnel address in 10.2.0.0/26.
type cluster struct {
	store             *datastore.Store
	gone, stays       *ipam.Engine
	goneIP, borrowed  net.IP
	swarmIP, staysOwn net.IP
	vtep              string
}

func assign(t *testing.T, e *ipam.Engine, host string, within string, attrs map[string]string) net.IP {
	t.Helper()
	_, sub, _ := net.ParseCIDR(within)
	n, err := e.AutoAssign(context.Background(), ipam.AutoAssignArgs{Host: host, HandleID: "cnm." + host + "." + randSuffix(), Attrs: attrs, Within: sub})
	if err != nil {
		t.Fatalf("assign for %s in %s: %v", host, within, err)
	}
	return n.IP
}

var seq int

func randSuffix() string {
	seq++
	return string(rune('a'+seq%26)) + time.Now().Format("150405.000000000")
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	ctx := context.Background()
	m := etcdtest.Start(t)
	c := &cluster{store: m.Store}
	c.gone = ipam.New(m.Store, ipam.Options{Log: quietLog()})
	c.stays = ipam.New(m.Client(t), ipam.Options{Log: quietLog()})
	for _, cidr := range []string{"10.1.0.0/26", "10.2.0.0/26", "10.3.0.0/26"} {
		if _, err := c.gone.AddPool(ctx, ipam.Pool{CIDR: cidr, BlockSize: 26}); err != nil {
			t.Fatal(err)
		}
	}
	attrs := func(node string) map[string]string { return map[string]string{ipam.AttrNode: node} }
	c.goneIP = assign(t, c.gone, "gone", "10.1.0.0/26", attrs("gone"))
	c.borrowed = assign(t, c.stays, "stays", "10.1.0.0/26", attrs("stays")) // the pool's only block is gone's
	c.swarmIP = assign(t, c.gone, "gone", "10.1.0.0/26", map[string]string{ipam.AttrNode: "gone", ipam.AttrSwarm: "true"})
	empty := assign(t, c.gone, "gone", "10.2.0.0/26", attrs("gone"))
	if err := c.gone.ReleaseIP(ctx, empty); err != nil {
		t.Fatal(err)
	}
	c.staysOwn = assign(t, c.stays, "stays", "10.3.0.0/26", attrs("stays"))
	// gone's VXLAN tunnel address keeps its otherwise empty block.
	vtep, err := c.gone.EnsureTunnelAddress(ctx, "gone", []netip.Prefix{netip.MustParsePrefix("10.2.0.0/26")})
	if err != nil {
		t.Fatal(err)
	}
	c.vtep = vtep.String()

	put := func(key string, v any) {
		t.Helper()
		if err := m.Store.Txn(ctx, datastore.Create(key, datastore.MustJSON(v))); err != nil {
			t.Fatal(err)
		}
	}
	put(datastore.NodeKey("gone"), datastore.Node{Name: "gone", IPv4: "172.16.0.1", ASN: 64512, VXLANTunnelAddr: c.vtep, VXLANTunnelMAC: "66:00:00:00:00:01"})
	put(datastore.NodeKey("stays"), datastore.Node{Name: "stays", IPv4: "172.16.0.2", ASN: 64512})
	put(datastore.EndpointKey("gone", "e1"), datastore.Endpoint{Node: "gone", Network: "n1"})
	put(datastore.EndpointKey("stays", "e2"), datastore.Endpoint{Node: "stays", Network: "n1"})
	put(datastore.BGPPeerKey("tor-of-gone"), datastore.BGPPeer{Name: "tor-of-gone", PeerIP: "172.16.0.254", ASN: 65000, Node: "gone"})
	put(datastore.BGPPeerKey("global-rr"), datastore.BGPPeer{Name: "global-rr", PeerIP: "172.16.0.253", ASN: 64512})
	return c
}

func (c *cluster) allocated(t *testing.T) []string {
	t.Helper()
	as, err := c.stays.Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.IP.String())
	}
	return out
}

func (c *cluster) exists(t *testing.T, key string) bool {
	t.Helper()
	_, err := c.store.Get(context.Background(), key)
	if errors.Is(err, datastore.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func TestListAndDelete(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)

	// "stays" runs; "gone" does not.
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.store.KeepAlive(kctx, datastore.Alive{Node: "stays", PID: 1, Since: time.Now().UTC()}, 5*time.Second, quietLog())
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a, _ := c.store.AliveNodes(ctx); len(a) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stays never marked alive")
		}
		time.Sleep(50 * time.Millisecond)
	}

	list, err := nodes.List(ctx, c.store, c.stays)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]nodes.Info{}
	for _, n := range list {
		byName[n.Name] = n
	}
	if g := byName["gone"]; g.Alive || g.BGPAddress != "172.16.0.1" || g.Blocks != 2 || g.Addresses != 1 || g.Endpoints != 1 || g.VTEP != c.vtep || g.VTEPMAC != "66:00:00:00:00:01" {
		t.Errorf("node list: gone = %+v; want down, 172.16.0.1, 2 blocks, 1 address (the swarm one is the manager's), 1 endpoint, VTEP %s", g, c.vtep)
	}
	if s := byName["stays"]; !s.Alive || s.AliveSince == nil || s.Blocks != 1 || s.Addresses != 2 || s.Endpoints != 1 {
		t.Errorf("node list: stays = %+v; want up, 1 block, 2 addresses, 1 endpoint", s)
	}

	t.Run("a running node is refused", func(t *testing.T) {
		_, err := nodes.Delete(ctx, c.store, c.gone, "stays", false, quietLog())
		if !errors.Is(err, nodes.ErrNodeAlive) {
			t.Fatalf("Delete(stays) = %v, want ErrNodeAlive", err)
		}
		if !c.exists(t, datastore.NodeKey("stays")) || !slices.Contains(c.allocated(t), c.staysOwn.String()) {
			t.Error("a refused delete changed something")
		}
	})
	t.Run("an unknown node is refused", func(t *testing.T) {
		if _, err := nodes.Delete(ctx, c.store, c.gone, "nosuch", false, quietLog()); !errors.Is(err, nodes.ErrUnknownNode) {
			t.Fatalf("Delete(nosuch) = %v, want ErrUnknownNode", err)
		}
	})

	// A restore awaits both nodes' reconcile; the deleted one never will.
	f, rev, err := c.store.ReadFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.Restore = &datastore.RestoreHold{Since: time.Now(), Complete: true, Pending: []string{"gone", "stays"}}
	if err := c.store.Txn(ctx, datastore.Write(datastore.FormatKey, datastore.MustJSON(f), rev)); err != nil {
		t.Fatal(err)
	}
	rep, err := nodes.Delete(ctx, c.store, c.gone, "gone", false, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if f, _, err := c.store.ReadFormat(ctx); err != nil || f.Restore == nil || !slices.Equal(f.Restore.Pending, []string{"stays"}) {
		t.Errorf("restore hold after deleting gone: %+v, %v; want stays alone awaited", f.Restore, err)
	}
	if !rep.NodeRecord || rep.Endpoints != 1 || !slices.Equal(rep.Addresses, []string{c.goneIP.String()}) ||
		len(rep.Blocks.Released) != 1 || rep.Blocks.Released[0].String() != "10.2.0.0/26" ||
		len(rep.Blocks.Orphaned) != 1 || rep.Blocks.Orphaned[0].String() != "10.1.0.0/26" ||
		!slices.Equal(rep.BGPPeers, []string{"tor-of-gone"}) {
		t.Errorf("report = %+v", rep)
	}
	for _, key := range []string{datastore.NodeKey("gone"), datastore.EndpointKey("gone", "e1"), datastore.BGPPeerKey("tor-of-gone"), "ipam/affinity/gone/10.1.0.0-26", "ipam/affinity/gone/10.2.0.0-26"} {
		if c.exists(t, key) {
			t.Errorf("%s survives the delete", key)
		}
	}
	for _, key := range []string{datastore.NodeKey("stays"), datastore.EndpointKey("stays", "e2"), datastore.BGPPeerKey("global-rr")} {
		if !c.exists(t, key) {
			t.Errorf("%s (not the deleted node's) was removed", key)
		}
	}
	got := c.allocated(t)
	want := []string{c.borrowed.String(), c.swarmIP.String(), c.staysOwn.String()}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("allocated after the delete = %v, want %v (the borrowed, swarm and other node's addresses)", got, want)
	}
	usage, err := c.stays.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range usage {
		if u.Host == "gone" {
			t.Errorf("block %s is still affine to the deleted node", u.CIDR)
		}
	}
	report, err := c.stays.Check(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if report.Problems() != 0 {
		t.Errorf("ipam check after the delete: %+v", report)
	}

	// The orphaned block goes once the last borrowed address is released.
	for _, ip := range []net.IP{c.borrowed, c.swarmIP} {
		if err := c.stays.ReleaseIP(ctx, ip); err != nil {
			t.Fatal(err)
		}
	}
	if c.exists(t, "ipam/blocks/10.1.0.0-26") {
		t.Error("the emptied block without affinity is still there")
	}

	// Deleting again: nothing is known of it any more.
	if _, err := nodes.Delete(ctx, c.store, c.gone, "gone", false, quietLog()); !errors.Is(err, nodes.ErrUnknownNode) {
		t.Errorf("second Delete(gone) = %v, want ErrUnknownNode", err)
	}
	// --force removes a node whose lease is still there.
	cancel()
	if _, err := nodes.Delete(ctx, c.store, c.gone, "stays", true, quietLog()); err != nil {
		t.Fatalf("forced Delete(stays): %v", err)
	}
	if list, _ := nodes.List(ctx, c.store, c.stays); len(list) != 0 {
		t.Errorf("nodes after deleting both: %+v", list)
	}
}
