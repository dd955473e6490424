package driver_test

import (
	"context"
	"errors"
	"net"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Issue 12 item 4: the swarm shortcut (an address the manager assigned is
// answered without a second assignment) must never hand one address to two
// holders, and a late release must not free the next holder.
func TestSwarmShortcutIsSafe(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	newEngine := immediateEngines(m)
	mgr := driver.NewIPAMDriver(newEngine(), "mgr", quietLog())
	wrk := driver.NewIPAMDriver(newEngine(), "wrk", quietLog())
	eng := newEngine()
	holder := func(ip net.IP) (ipam.Allocation, bool) {
		t.Helper()
		a, found, err := eng.AddressHolder(ctx, ip)
		if err != nil {
			t.Fatal(err)
		}
		return a, found
	}
	serial := map[string]string{"com.docker.network.ipam.serial": "true"}
	mp, err := mgr.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoGlobalAddressSpace, Pool: "192.168.7.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	// The node's view of the same swarm network, and a network of its own
	// in the default pool.
	wp, err := wrk.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace, Pool: "192.168.7.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := wrk.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace})
	if err != nil {
		t.Fatal(err)
	}
	task, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Options: serial})
	if err != nil {
		t.Fatal(err)
	}
	taskIP, _, _ := net.ParseCIDR(task.Address)
	first, _ := holder(taskIP)

	t.Run("the task's node shares it through the same pool", func(t *testing.T) {
		got, err := wrk.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: wp.PoolID, Address: taskIP.String()})
		if err != nil || got.Address != task.Address {
			t.Fatalf("node RequestAddress(%s) in the swarm network's pool = %+v, %v", taskIP, got, err)
		}
	})
	t.Run("another pool does not share it", func(t *testing.T) {
		got, err := wrk.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: other.PoolID, Address: taskIP.String()})
		if !errors.Is(err, ipam.ErrAddressInUse) {
			t.Fatalf("RequestAddress(%s) in pool %s, not the task's = %+v, %v; want ErrAddressInUse", taskIP, other.PoolID, got, err)
		}
	})
	t.Run("a second attachment asking the same manager for it is refused", func(t *testing.T) {
		got, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Address: taskIP.String(), Options: serial})
		if !errors.Is(err, ipam.ErrAddressInUse) {
			t.Fatalf("the manager gave %s, which it assigned to a task, to a new attachment: %+v, %v", taskIP, got, err)
		}
	})
	t.Run("a restarted manager restores it, once", func(t *testing.T) {
		restarted := driver.NewIPAMDriver(newEngine(), "mgr", quietLog())
		rp, err := restarted.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoGlobalAddressSpace, Pool: "192.168.7.0/24"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := restarted.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: rp.PoolID, Address: taskIP.String(), Options: serial})
		if err != nil || got.Address != task.Address {
			t.Fatalf("restore of %s = %+v, %v", taskIP, got, err)
		}
		if a, _ := holder(taskIP); a.HandleID != first.HandleID {
			t.Errorf("restore re-assigned %s: handle %s -> %s", taskIP, first.HandleID, a.HandleID)
		}
		if _, err := restarted.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: rp.PoolID, Address: taskIP.String(), Options: serial}); !errors.Is(err, ipam.ErrAddressInUse) {
			t.Fatalf("after the restore, a new attachment got %s too: %v", taskIP, err)
		}
		mgr = restarted
	})
	t.Run("a late manager release spares the next holder", func(t *testing.T) {
		rel := &ipamapi.ReleaseAddressRequest{PoolID: mp.PoolID, Address: taskIP.String()}
		if err := mgr.ReleaseAddress(ctx, rel); err != nil {
			t.Fatal(err)
		}
		if _, found := holder(taskIP); found {
			t.Fatalf("%s still held after the manager freed the task", taskIP)
		}
		// A container of the node's own takes the address ...
		if _, err := wrk.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: wp.PoolID, Address: taskIP.String()}); err != nil {
			t.Fatal(err)
		}
		next, _ := holder(taskIP)
		// ... and the manager's release arrives again.
		if err := mgr.ReleaseAddress(ctx, rel); err != nil {
			t.Fatal(err)
		}
		if a, found := holder(taskIP); !found || a.HandleID != next.HandleID {
			t.Fatalf("a repeated manager release freed %s from the node's container (holder %+v, found %v)", taskIP, a, found)
		}
	})
}
