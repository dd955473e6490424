package driver_test

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"
	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// The swarm flow of Docker 20.10, as swarmkit's allocator and libnetwork
// make the calls: the manager asks in the global address space, a node in
// the local one (libnetwork gives swarm networks local data scope), and the
// node asks for the very address the manager assigned to its task.
// Manager and worker are two engines (two hosts) on one etcd.
func TestSwarmIPAM(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	newEngine := immediateEngines(m)
	mgrEng, wrkEng := newEngine(), newEngine()
	mgr := driver.NewIPAMDriver(mgrEng, "mgr", quietLog())
	wrk := driver.NewIPAMDriver(wrkEng, "wrk", quietLog())

	// The manager's allocatePools: global space, no --subnet, then (on
	// a restart) the gateway it got back, 0.0.0.0.
	mp, err := mgr.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoGlobalAddressSpace})
	if err != nil || mp.PoolID != driver.SwarmPoolIDPrefix+driver.PoolIDV4 || mp.Pool != "0.0.0.0/0" {
		t.Fatalf("manager RequestPool = %+v, %v; want PoolID %q, Pool 0.0.0.0/0", mp, err, driver.SwarmPoolIDPrefix+driver.PoolIDV4)
	}
	gw, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Address: "0.0.0.0",
		Options: map[string]string{driver.RequestAddressTypeKey: driver.RequestAddressTypeGateway, "com.docker.network.ipam.serial": "true"}})
	if err != nil || gw.Address != driver.VirtualGatewayIPv4 {
		t.Fatalf("manager gateway request = %+v, %v", gw, err)
	}
	// A node creates the network from the manager's allocation: pool
	// 0.0.0.0/0, local space.
	wp, err := wrk.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace, Pool: "0.0.0.0/0"})
	if err != nil || wp.PoolID != driver.PoolIDV4 {
		t.Fatalf("node RequestPool = %+v, %v; want PoolID %q", wp, err, driver.PoolIDV4)
	}

	serial := map[string]string{"com.docker.network.ipam.serial": "true"}
	task, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Options: serial})
	if err != nil {
		t.Fatalf("manager task address: %v", err)
	}
	taskIP, _, _ := net.ParseCIDR(task.Address)
	holder := func(ip net.IP) (ipam.Allocation, bool) {
		t.Helper()
		a, found, err := mgrEng.AddressHolder(ctx, ip)
		if err != nil {
			t.Fatalf("AddressHolder(%s): %v", ip, err)
		}
		return a, found
	}
	a, found := holder(taskIP)
	if !found || a.Attrs[ipam.AttrSwarm] != "true" || a.Attrs[ipam.AttrNode] != "mgr" || a.Host != "mgr" {
		t.Fatalf("task address %s: holder %+v (found %v); want a swarm assignment of node mgr in a block of mgr", taskIP, a, found)
	}

	t.Run("node uses the manager's address without assigning it", func(t *testing.T) {
		got, err := wrk.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: wp.PoolID, Address: taskIP.String()})
		if err != nil || got.Address != task.Address {
			t.Fatalf("node RequestAddress(%s) = %+v, %v; want %s", taskIP, got, err, task.Address)
		}
		if b, _ := holder(taskIP); b.HandleID != a.HandleID {
			t.Errorf("holder of %s changed from %s to %s", taskIP, a.HandleID, b.HandleID)
		}
		blocks, err := wrkEng.HostBlocks(ctx, "wrk")
		if err != nil || len(blocks) != 0 {
			t.Errorf("the node claimed blocks %v (%v): it must not assign", blocks, err)
		}
	})

	t.Run("node release leaves it to the manager", func(t *testing.T) {
		if err := wrk.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: wp.PoolID, Address: taskIP.String()}); err != nil {
			t.Fatal(err)
		}
		if _, found := holder(taskIP); !found {
			t.Fatalf("the node's ReleaseAddress freed %s, which the manager assigned", taskIP)
		}
	})

	t.Run("manager restart re-requests its addresses", func(t *testing.T) {
		restarted := driver.NewIPAMDriver(newEngine(), "mgr", quietLog())
		got, err := restarted.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Address: taskIP.String(), Options: serial})
		if err != nil || got.Address != task.Address {
			t.Fatalf("restore RequestAddress(%s) = %+v, %v", taskIP, got, err)
		}
		if b, _ := holder(taskIP); b.HandleID != a.HandleID {
			t.Errorf("restore re-assigned %s: handle %s -> %s", taskIP, a.HandleID, b.HandleID)
		}
	})

	t.Run("local addresses keep their rules", func(t *testing.T) {
		local, err := wrk.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: wp.PoolID})
		if err != nil {
			t.Fatal(err)
		}
		lip, _, _ := net.ParseCIDR(local.Address)
		if la, _ := holder(lip); la.Attrs[ipam.AttrSwarm] != "" {
			t.Errorf("a node's own address carries %s=%q", ipam.AttrSwarm, la.Attrs[ipam.AttrSwarm])
		}
		// Neither a second local --ip nor the manager may take it.
		for name, req := range map[string]*ipamapi.RequestAddressRequest{
			"node --ip":    {PoolID: wp.PoolID, Address: lip.String()},
			"manager --ip": {PoolID: mp.PoolID, Address: lip.String(), Options: serial},
		} {
			if _, err := map[string]*driver.IPAMDriver{"node --ip": wrk, "manager --ip": mgr}[name].RequestAddress(ctx, req); !errors.Is(err, ipam.ErrAddressInUse) {
				t.Errorf("%s of the node's address %s: %v; want ErrAddressInUse", name, lip, err)
			}
		}
		if err := wrk.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: wp.PoolID, Address: lip.String()}); err != nil {
			t.Fatal(err)
		}
		if _, found := holder(lip); found {
			t.Errorf("the node's own address %s survived its release", lip)
		}
	})

	t.Run("manager release frees it", func(t *testing.T) {
		if err := mgr.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: mp.PoolID, Address: taskIP.String()}); err != nil {
			t.Fatal(err)
		}
		if _, found := holder(taskIP); found {
			t.Fatalf("%s still assigned after the manager's release", taskIP)
		}
		// A release after the manager lost its pool mapping (PoolID "").
		again, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: mp.PoolID, Options: serial})
		if err != nil {
			t.Fatal(err)
		}
		aip, _, _ := net.ParseCIDR(again.Address)
		if err := mgr.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{Address: aip.String()}); err != nil {
			t.Fatal(err)
		}
		if _, found := holder(aip); found {
			t.Errorf("%s still assigned after a release without pool id", aip)
		}
	})

	t.Run("swarm pool with --subnet", func(t *testing.T) {
		p, err := mgr.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoGlobalAddressSpace, Pool: "192.168.7.0/24"})
		if err != nil || p.PoolID != driver.SwarmPoolIDPrefix+"192.168.7.0/24" || p.Pool != "192.168.7.0/24" {
			t.Fatalf("RequestPool = %+v, %v", p, err)
		}
		got, err := mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: p.PoolID, Address: "192.168.8.1"})
		if !errors.Is(err, ipam.ErrNotInPool) {
			t.Errorf("address outside the swarm subnet: %+v, %v", got, err)
		}
		got, err = mgr.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: p.PoolID, Options: serial})
		if ip, _, _ := net.ParseCIDR(got.Address); err != nil || !mustNet("192.168.7.0/24").Contains(ip) {
			t.Errorf("RequestAddress in the swarm subnet = %+v, %v", got, err)
		}
	})
}

// newSwarmDriver is a global-scope network driver of host on store.
func newSwarmDriver(e *env, host string) *driver.NetworkDriver {
	return driver.NewNetworkDriver(e.store, e.dp, host, quietLog(), driver.Options{Scope: driver.ScopeGlobal, IPAM: e.ipam})
}

// nodeCreate is CreateNetwork as a node's libnetwork sends it for a swarm
// network: the manager's AllocateNetwork options as generic options.
func nodeCreate(ctx context.Context, d *driver.NetworkDriver, id string, opts map[string]string) error {
	generic := map[string]interface{}{}
	for k, v := range opts {
		generic[k] = v
	}
	return d.CreateNetwork(ctx, &network.CreateNetworkRequest{
		NetworkID: id,
		Options:   map[string]interface{}{"com.docker.network.generic": generic, "com.docker.network.enable_ipv6": false},
		IPv4Data:  v4Data("0.0.0.0/0"),
	})
}

func TestAllocateNetwork(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	mgr, n1, n2 := newSwarmDriver(e, "mgr"), newSwarmDriver(e, "n1"), newSwarmDriver(e, "n2")
	// swarmkit's IPAMData: no address space, gateway with the pool's mask.
	swarmData := func(pool, gw string) []network.IPAMData {
		return []network.IPAMData{{Pool: pool, Gateway: gw}}
	}

	t.Run("lifecycle", func(t *testing.T) {
		id := newID('s')
		req := &network.AllocateNetworkRequest{NetworkID: id, Options: map[string]string{"calico.isolation": "off"}, IPv4Data: swarmData("0.0.0.0/0", "0.0.0.0/0")}
		resp, err := mgr.AllocateNetwork(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"calico.isolation": "off", driver.OptSwarm: "true"}
		if !reflect.DeepEqual(resp.Options, want) {
			t.Errorf("AllocateNetwork options = %v, want %v", resp.Options, want)
		}
		rec, ok := e.network(t, id)
		if !ok || !reflect.DeepEqual(rec.Options, want) || !reflect.DeepEqual(rec.Subnets, []string{"0.0.0.0/0"}) {
			t.Fatalf("record after AllocateNetwork = %+v (found %v)", rec, ok)
		}
		// A restarted manager allocates again, with its stored options.
		req.Options = resp.Options
		if resp2, err := mgr.AllocateNetwork(ctx, req); err != nil || !reflect.DeepEqual(resp2.Options, want) {
			t.Errorf("second AllocateNetwork = %+v, %v", resp2, err)
		}
		// Every node running a task creates the network.
		for _, d := range []*driver.NetworkDriver{n1, n2, mgr} {
			if err := nodeCreate(ctx, d, id, resp.Options); err != nil {
				t.Fatalf("node CreateNetwork: %v", err)
			}
		}
		// A node dropping it keeps the shared record.
		if err := n1.DeleteNetwork(ctx, &network.DeleteNetworkRequest{NetworkID: id}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.network(t, id); !ok {
			t.Fatal("a node's DeleteNetwork removed the record the other nodes share")
		}
		ep := e.createEndpoint(t, id, "10.10.3.4/32", "")
		if _, ok := e.endpoint(t, ep); !ok {
			t.Fatal("no endpoint on the swarm network")
		}
		for i := 0; i < 2; i++ {
			if err := mgr.FreeNetwork(ctx, &network.FreeNetworkRequest{NetworkID: id}); err != nil {
				t.Fatalf("FreeNetwork #%d: %v", i+1, err)
			}
		}
		if _, ok := e.network(t, id); ok {
			t.Error("record survives FreeNetwork")
		}
	})

	t.Run("node before the record", func(t *testing.T) {
		// E.g. the record was lost: the first node writes it, the next
		// one shares it.
		id := newID('s')
		opts := map[string]string{driver.OptSwarm: "true"}
		if err := nodeCreate(ctx, n1, id, opts); err != nil {
			t.Fatal(err)
		}
		if err := nodeCreate(ctx, n2, id, opts); err != nil {
			t.Fatal(err)
		}
		if rec, ok := e.network(t, id); !ok || rec.Options[driver.OptSwarm] != "true" {
			t.Errorf("record = %+v (found %v)", rec, ok)
		}
	})

	local := newID('l')
	if err := e.nd.CreateNetwork(ctx, &network.CreateNetworkRequest{NetworkID: local, IPv4Data: v4Data("10.10.1.0/24")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		req     network.AllocateNetworkRequest
		wantErr error
		wantMsg string
	}{
		{"no id", network.AllocateNetworkRequest{IPv4Data: swarmData("0.0.0.0/0", "0.0.0.0/0")}, driver.ErrInvalidRequest, "without a network id"},
		{"no IPv4", network.AllocateNetworkRequest{NetworkID: newID('s')}, driver.ErrInvalidRequest, "--ipam-driver"},
		{"default IPAM", network.AllocateNetworkRequest{NetworkID: newID('s'), IPv4Data: swarmData("10.0.1.0/24", "10.0.1.1/24")}, ipam.ErrPoolNotFound, "--ipam-driver"},
		{"foreign address space", network.AllocateNetworkRequest{NetworkID: newID('s'), IPv4Data: []network.IPAMData{{AddressSpace: "GlobalDefault", Pool: "10.10.1.0/24"}}}, driver.ErrForeignIPAM, "--ipam-driver"},
		{"bad pool", network.AllocateNetworkRequest{NetworkID: newID('s'), IPv4Data: swarmData("10.10.1.0", "")}, driver.ErrInvalidRequest, "invalid address pool"},
		{"id of a local network", network.AllocateNetworkRequest{NetworkID: local, IPv4Data: swarmData("10.10.1.0/24", "0.0.0.0/24")}, driver.ErrAlreadyExists, "network of one host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mgr.AllocateNetwork(ctx, &tc.req)
			if !errors.Is(err, tc.wantErr) || err == nil || !strings.Contains(err.Error(), tc.wantMsg) || strings.Contains(err.Error(), "\n") {
				t.Errorf("AllocateNetwork = %v; want %v saying %q in one line", err, tc.wantErr, tc.wantMsg)
			}
			if tc.req.NetworkID != "" && tc.req.NetworkID != local {
				if _, ok := e.network(t, tc.req.NetworkID); ok {
					t.Error("a refused AllocateNetwork left a record")
				}
			}
		})
	}

	t.Run("local scope refuses the swarm option", func(t *testing.T) {
		err := nodeCreate(ctx, e.nd, newID('s'), map[string]string{driver.OptSwarm: "true"})
		if !errors.Is(err, driver.ErrInvalidRequest) || !strings.Contains(err.Error(), driver.OptSwarm) {
			t.Errorf("CreateNetwork -o %s=true in local scope = %v", driver.OptSwarm, err)
		}
	})

	t.Run("local networks keep their rules", func(t *testing.T) {
		// Same id twice is refused, and DeleteNetwork removes the record.
		err := newSwarmDriver(e, "n1").CreateNetwork(ctx, &network.CreateNetworkRequest{NetworkID: local, IPv4Data: v4Data("10.10.1.0/24")})
		if !errors.Is(err, driver.ErrAlreadyExists) {
			t.Errorf("second CreateNetwork of a non-swarm network = %v", err)
		}
		if err := e.nd.DeleteNetwork(ctx, &network.DeleteNetworkRequest{NetworkID: local}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.network(t, local); ok {
			t.Error("DeleteNetwork kept a non-swarm record")
		}
	})
}

// The fake IPAM answers AddressHolder like the engine.
func TestFakeAddressHolder(t *testing.T) {
	f := drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"})
	ctx := context.Background()
	if err := f.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP("10.10.0.9"), Host: "h", HandleID: "x", Attrs: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	a, found, err := f.AddressHolder(ctx, net.ParseIP("10.10.0.9"))
	if err != nil || !found || a.HandleID != "x" || a.Attrs["k"] != "v" {
		t.Errorf("held: %+v %v %v", a, found, err)
	}
	if _, found, err := f.AddressHolder(ctx, net.ParseIP("10.10.0.10")); err != nil || found {
		t.Errorf("free: %v %v", found, err)
	}
	if _, _, err := f.AddressHolder(ctx, net.ParseIP("10.11.0.1")); !errors.Is(err, ipam.ErrNotInPool) {
		t.Errorf("outside: %v", err)
	}
}

// immediateEngines makes IPAM engines on m's etcd, one a host, that
// release addresses at once.
func immediateEngines(m *etcdtest.Member) func() *ipam.Engine {
	return func() *ipam.Engine {
		return ipam.New(m.Store, ipam.Options{Log: quietLog(), ReleaseGracePeriod: ipam.ReleaseImmediately})
	}
}
