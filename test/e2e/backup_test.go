package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// endpointID is the Docker endpoint id of container on network.
func endpointID(t *testing.T, h *harness.Host, container, network string) string {
	t.Helper()
	return strings.TrimSpace(h.MustDocker(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).EndpointID}}`, network), container))
}

// notAmong fails unless ip is none of taken (an address handed out twice).
func notAmong(t *testing.T, what string, ip net.IP, taken ...net.IP) {
	t.Helper()
	for _, o := range taken {
		if ip.Equal(o) {
			t.Fatalf("%s got %s, the address of a running container: handed out twice", what, ip)
		}
	}
}

// waitRestoreReconciled waits until every node of a restore has
// reconciled: `datastore info` shows no hold on new addresses any more.
func waitRestoreReconciled(t *testing.T, d time.Duration, ctl func(args ...string) (string, error)) {
	t.Helper()
	harness.Eventually(t, d, 250*time.Millisecond, "every node reconciled after the restore", func() error {
		out, err := ctl("datastore", "info")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.Contains(out, "held back") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
}

// TestBackupRestoreEmbedded: a host on its embedded member. c1 and c2 run
// when the backup is taken, c3 starts after it. The datastore is lost (the
// daemon stopped, <state-dir>/etcd removed, the daemon started on a fresh
// member: it writes back the cluster id it remembers), the backup is
// restored with the daemon up: its records come back, the daemon
// reconciles at once (the restore rewrites the format record last) and
// re-assigns c3's address, which no record held. Every container keeps its
// address and its connectivity, and c4, started after the restore, gets a
// fresh address.
func TestBackupRestoreEmbedded(t *testing.T) {
	t.Parallel()
	h := newCalicoHost(t, "bkemb")
	d := func(args ...string) string { return h.MustDocker(t, args...) }
	cli := func(args ...string) string {
		t.Helper()
		out, err := h.cli(t, args...)
		if err != nil {
			t.Fatalf("calico-cnm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net1")
	for _, c := range []string{"c1", "c2"} {
		d("run", "-d", "--name", c, "--net", "net1", harness.Image, "sleep", "3600")
	}
	ip1, ip2 := h.containerIP(t, "c1", "net1"), h.containerIP(t, "c2", "net1")
	file := filepath.Join(t.TempDir(), "backup.json")
	t.Logf("backup: %s", strings.TrimSpace(cli("datastore", "backup", file)))
	d("run", "-d", "--name", "c3", "--net", "net1", harness.Image, "sleep", "3600")
	ip3 := h.containerIP(t, "c3", "net1")
	ep3 := endpointID(t, h.Host, "c3", "net1")
	t.Logf("c1=%s c2=%s in the backup, c3=%s after it", ip1, ip2, ip3)

	// Lose the datastore.
	if err := h.plugin.Stop(t); err != nil {
		t.Fatalf("stopping the daemon: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(h.StateDir, "etcd")); err != nil {
		t.Fatal(err)
	}
	h.plugin.Start(t)
	if out := cli("network", "list", "-o", "json"); strings.Contains(out, "net1") {
		t.Fatalf("the fresh datastore still knows net1:\n%s", out)
	}

	out := cli("datastore", "restore", file)
	t.Logf("restore: %s", strings.TrimSpace(out))
	if want := "new addresses are held back until " + h.Name + " have reconciled"; !strings.Contains(out, want) {
		t.Errorf("restore did not say %q", want)
	}
	// The reconcile the restore triggers re-assigns c3's address to it.
	harness.Eventually(t, 20*time.Second, 200*time.Millisecond, "c3's address re-assigned", func() error {
		out, err := h.Exec(t, "etcdctl", "--endpoints", "http://127.0.0.1:2379", "get", "--prefix", datastore.DefaultPrefix+"ipam/")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !strings.Contains(out, ep3) {
			return fmt.Errorf("no assignment names c3's endpoint %s", ep3[:12])
		}
		return nil
	})
	if !h.plugin.LogContains("re-assigned an address a running container uses") {
		t.Errorf("the daemon did not log the reclaim")
	}
	waitRestoreReconciled(t, 20*time.Second, func(args ...string) (string, error) { return h.cli(t, args...) })

	for _, c := range []struct {
		name string
		ip   net.IP
	}{{"c1", ip1}, {"c2", ip2}, {"c3", ip3}} {
		if got := h.containerIP(t, c.name, "net1"); !got.Equal(c.ip) {
			t.Errorf("%s has %s after the restore, had %s", c.name, got, c.ip)
		}
	}
	d("run", "-d", "--name", "c4", "--net", "net1", harness.Image, "sleep", "3600")
	ip4 := h.containerIP(t, "c4", "net1")
	notAmong(t, "c4, started after the restore,", ip4, ip1, ip2, ip3)
	for _, p := range []struct {
		from string
		to   net.IP
	}{{"c1", ip2}, {"c1", ip3}, {"c3", ip1}, {"c4", ip3}, {"c2", ip4}} {
		if out, err := h.Docker(t, "exec", p.from, "ping", "-c", "1", "-W", "2", p.to.String()); err != nil {
			t.Errorf("%s cannot ping %s after the restore: %v\n%s", p.from, p.to, err, out)
		}
	}
	t.Logf("after the restore: c1..c3 kept %s %s %s, c4 got %s", ip1, ip2, ip3, ip4)
}

// TestBackupRestoreExternal: two hosts on an external etcd (BGP mesh). a1
// and b1 run when the backup is taken, a2 starts after it. The etcd member
// is wiped (stopped, its data dir removed, started empty) under the
// running daemons, and the backup restored: a2's address is re-assigned to
// host a by its reconcile, every container keeps its address and reaches
// the other host's, and containers started after the restore get fresh
// addresses.
func TestBackupRestoreExternal(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	c := &bgpCluster{bin: harness.BuildBinary(t), fabric: harness.NewFabric(t, "")}
	etcd := harness.StartEtcd(t, c.fabric.Gateway.String())
	c.etcd = etcd.Endpoint
	c.mustCtl(t, "pool", "add", mhPool)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	ipA1, ipB1 := a.run(t, "a1"), b.run(t, "b1")
	a.waitRoute(t, blockOf26(ipB1), b.IP, true, 30*time.Second)
	a.ping(t, "a1", ipB1)

	file := filepath.Join(t.TempDir(), "backup.json")
	t.Logf("backup: %s", strings.TrimSpace(c.mustCtl(t, "datastore", "backup", file)))
	ipA2 := a.run(t, "a2")
	epA2 := endpointID(t, a.Host, "a2", mhNetwork)
	t.Logf("a1=%s b1=%s in the backup, a2=%s after it", ipA1, ipB1, ipA2)

	// Wipe the member under the running daemons.
	// etcd exits on SIGTERM with the signal as its status; Stop fails the
	// test itself if it has to kill it.
	_ = etcd.Stop(t)
	if err := os.RemoveAll(etcd.DataDir); err != nil {
		t.Fatal(err)
	}
	etcd.Start(t)
	if out := c.mustCtl(t, "network", "list", "-o", "json"); strings.Contains(out, mhNetwork) {
		t.Fatalf("the wiped member still knows %s:\n%s", mhNetwork, out)
	}

	t.Logf("restore: %s", strings.TrimSpace(c.mustCtl(t, "datastore", "restore", file)))
	store := c.openStore(t)
	eng := ipam.New(store, ipam.Options{Log: logrus.New()})
	// The daemons learn of the restore from the format record, read at
	// least every resync interval (30 s) when the wiped member's watches
	// wait for revisions it has not reached.
	harness.Eventually(t, 75*time.Second, 250*time.Millisecond, "a2's address re-assigned to host a", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		as, err := eng.Allocations(ctx)
		if err != nil {
			return err
		}
		for _, al := range as {
			if al.IP.Equal(ipA2) {
				if al.Attrs[ipam.AttrNode] != a.Name || al.Attrs[ipam.AttrReclaimedFor] != epA2 {
					return fmt.Errorf("%s held by %+v", ipA2, al.Attrs)
				}
				return nil
			}
		}
		return fmt.Errorf("%s is free", ipA2)
	})

	for _, x := range []struct {
		h    *bgpHost
		name string
		ip   net.IP
	}{{a, "a1", ipA1}, {a, "a2", ipA2}, {b, "b1", ipB1}} {
		if got := x.h.ipOf(t, x.name); !got.Equal(x.ip) {
			t.Errorf("%s has %s after the restore, had %s", x.name, got, x.ip)
		}
	}
	// New addresses are held back until both hosts have reconciled; b
	// learns of the restore at its next datastore request at the latest
	// (its heartbeat, every 30 s).
	waitRestoreReconciled(t, 75*time.Second, func(args ...string) (string, error) { return c.ctl(t, args...) })
	ipA3, ipB3 := a.run(t, "a3"), b.run(t, "b3")
	notAmong(t, "a3, started after the restore,", ipA3, ipA1, ipA2, ipB1)
	notAmong(t, "b3, started after the restore,", ipB3, ipA1, ipA2, ipB1, ipA3)
	b.waitRoute(t, blockOf26(ipA2), a.IP, true, 60*time.Second)
	a.waitRoute(t, blockOf26(ipB1), b.IP, true, 60*time.Second)
	a.ping(t, "a1", ipB1)
	a.ping(t, "a3", ipB3)
	b.ping(t, "b1", ipA2)
	b.ping(t, "b3", ipA1)
	if out, err := c.ctl(t, "datastore", "info"); err != nil || !strings.Contains(out, "format:      1") {
		t.Errorf("datastore info after the restore: %v\n%s", err, out)
	}
	t.Logf("after the restore: a1=%s a2=%s b1=%s kept, a3=%s b3=%s new", ipA1, ipA2, ipB1, ipA3, ipB3)
}
