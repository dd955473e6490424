package driver_test

import (
	"context"
	"net"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"
	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Issue 12 item 3: the endpoint record names the handle of its address, and
// a release that knows the handle frees only that handle's assignment. A
// late or duplicate ReleaseAddress (dockerd retrying) must not free the
// address from the container that got it next.
func TestReleaseAddressSparesTheNextHolder(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	eng := immediateEngines(m)()
	id := driver.NewIPAMDriver(eng, testHost, quietLog())
	nd := driver.NewNetworkDriver(m.Store, drivertest.NewDataplane(), testHost, quietLog(), driver.Options{IPAM: eng})

	pool, err := id.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace, Pool: "192.168.7.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	netID := newID('n')
	if err := nd.CreateNetwork(ctx, &network.CreateNetworkRequest{NetworkID: netID,
		IPv4Data: []*network.IPAMData{{AddressSpace: driver.CalicoLocalAddressSpace, Pool: pool.Pool, Gateway: driver.VirtualGatewayIPv4}}}); err != nil {
		t.Fatal(err)
	}
	const addr = "192.168.7.9"
	holder := func() (ipam.Allocation, bool) {
		t.Helper()
		a, found, err := eng.AddressHolder(ctx, net.ParseIP(addr))
		if err != nil {
			t.Fatal(err)
		}
		return a, found
	}
	// docker run --ip: RequestAddress, CreateEndpoint.
	run := func() (endpointID string, handle string) {
		t.Helper()
		got, err := id.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: pool.PoolID, Address: addr})
		if err != nil {
			t.Fatalf("RequestAddress(%s): %v", addr, err)
		}
		endpointID = newID('e')
		if _, err := nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: endpointID,
			Interface: &network.EndpointInterface{Address: got.Address}}); err != nil {
			t.Fatal(err)
		}
		a, found := holder()
		if !found {
			t.Fatalf("%s not assigned after RequestAddress", addr)
		}
		var ep datastore.Endpoint
		if _, err := m.Store.GetJSON(ctx, datastore.EndpointKey(testHost, endpointID), &ep); err != nil {
			t.Fatal(err)
		}
		if len(ep.Handles) != 1 || ep.Handles[0] != a.HandleID {
			t.Fatalf("endpoint record names handles %v, want the address's handle %s", ep.Handles, a.HandleID)
		}
		return endpointID, a.HandleID
	}
	release := func() {
		t.Helper()
		if err := id.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: pool.PoolID, Address: addr}); err != nil {
			t.Fatalf("ReleaseAddress: %v", err)
		}
	}

	ep1, _ := run()
	// docker rm: DeleteEndpoint, then ReleaseAddress.
	if err := nd.DeleteEndpoint(ctx, &network.DeleteEndpointRequest{NetworkID: netID, EndpointID: ep1}); err != nil {
		t.Fatal(err)
	}
	release()
	if _, found := holder(); found {
		t.Fatalf("%s still assigned after its container's release", addr)
	}
	// The next container gets the same address ...
	_, h2 := run()
	// ... and the first container's release arrives again.
	release()
	if a, found := holder(); !found || a.HandleID != h2 {
		t.Fatalf("a repeated ReleaseAddress of the first container freed %s from the next one (holder now %+v, found %v; want handle %s)", addr, a, found, h2)
	}
}
