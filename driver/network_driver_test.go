package driver_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// env is a network driver on a real etcd with fake IPAM and dataplane. One
// etcd per top-level test; subtests use distinct ids.
type env struct {
	store *datastore.Store
	ipam  *drivertest.IPAM
	dp    *drivertest.Dataplane
	nd    *driver.NetworkDriver
}

func newEnv(t *testing.T, store *datastore.Store) *env {
	t.Helper()
	e := &env{
		store: store,
		ipam:  drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}, ipam.Pool{CIDR: "fd00:10::/48"}),
		dp:    drivertest.NewDataplane(),
	}
	e.nd = driver.NewNetworkDriver(store, e.dp, testHost, quietLog(), driver.Options{MTU: 1400, IPAM: e.ipam})
	return e
}

var idSeq atomic.Int64

// newID returns a fresh 64-hex Docker-style id.
func newID(kind byte) string {
	return fmt.Sprintf("%c%063x", kind, idSeq.Add(1))
}

func v4Data(pool string) []*network.IPAMData {
	return []*network.IPAMData{{AddressSpace: driver.CalicoLocalAddressSpace, Pool: pool, Gateway: "0.0.0.0/0"}}
}

func (e *env) createNetwork(t *testing.T, ipv6 bool) string {
	t.Helper()
	id := newID('a')
	req := &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("10.10.1.0/24")}
	if ipv6 {
		req.IPv6Data = []*network.IPAMData{{AddressSpace: driver.CalicoLocalAddressSpace, Pool: "fd00:10:0:1::/64", Gateway: "::/0"}}
	}
	if err := e.nd.CreateNetwork(context.Background(), req); err != nil {
		t.Fatalf("CreateNetwork: %v", err)
	}
	return id
}

func (e *env) createEndpoint(t *testing.T, netID, v4, v6 string) string {
	t.Helper()
	id := newID('e')
	_, err := e.nd.CreateEndpoint(context.Background(), &network.CreateEndpointRequest{
		NetworkID: netID, EndpointID: id,
		Interface: &network.EndpointInterface{Address: v4, AddressIPv6: v6},
	})
	if err != nil {
		t.Fatalf("CreateEndpoint: %v", err)
	}
	return id
}

func (e *env) network(t *testing.T, id string) (datastore.Network, bool) {
	t.Helper()
	var n datastore.Network
	_, err := e.store.GetJSON(context.Background(), datastore.NetworkKey(id), &n)
	if errors.Is(err, datastore.ErrNotFound) {
		return n, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return n, true
}

func (e *env) endpoint(t *testing.T, id string) (datastore.Endpoint, bool) {
	t.Helper()
	var ep datastore.Endpoint
	_, err := e.store.GetJSON(context.Background(), datastore.EndpointKey(testHost, id), &ep)
	if errors.Is(err, datastore.ErrNotFound) {
		return ep, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return ep, true
}

func TestNetworkCapabilities(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"", "local"}, {"local", "local"}, {"global", "global"}, {"swarm", "local"}} {
		d := driver.NewNetworkDriver(nil, drivertest.NewDataplane(), testHost, quietLog(), driver.Options{Scope: tc.in})
		c, err := d.GetCapabilities(context.Background())
		if err != nil || c.Scope != tc.want || c.ConnectivityScope != tc.want {
			t.Errorf("scope %q: GetCapabilities = %+v, %v; want %s", tc.in, c, err, tc.want)
		}
	}
}

func TestNoOpsAndUnsupported(t *testing.T) {
	d := driver.NewNetworkDriver(nil, drivertest.NewDataplane(), testHost, quietLog(), driver.Options{})
	ctx := context.Background()
	if err := d.DiscoverNew(ctx, &network.DiscoveryNotification{DiscoveryType: 1}); err != nil {
		t.Error(err)
	}
	if err := d.DiscoverDelete(ctx, &network.DiscoveryNotification{DiscoveryType: 1}); err != nil {
		t.Error(err)
	}
	if err := d.ProgramExternalConnectivity(ctx, &network.ProgramExternalConnectivityRequest{NetworkID: "n", EndpointID: "e"}); err != nil {
		t.Error(err)
	}
	if err := d.RevokeExternalConnectivity(ctx, &network.RevokeExternalConnectivityRequest{NetworkID: "n", EndpointID: "e"}); err != nil {
		t.Error(err)
	}
	// AllocateNetwork and FreeNetwork: see swarm_test.go.
}

func TestNetworks(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()

	t.Run("CreateNetwork", func(t *testing.T) {
		tests := []struct {
			name    string
			req     func(id string) *network.CreateNetworkRequest
			noIPAM  bool
			want    *datastore.Network // ID filled in
			wantErr []error
			wantMsg []string
		}{
			{
				name: "default network",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("0.0.0.0/0"),
						Options: map[string]interface{}{"com.docker.network.enable_ipv6": false, "com.docker.network.generic": map[string]interface{}{}}}
				},
				want: &datastore.Network{Subnets: []string{"0.0.0.0/0"}, Gateways: []string{"0.0.0.0/0"}, Options: map[string]string{"com.docker.network.enable_ipv6": "false"}},
			},
			{
				name: "subnet network with options and IPv6",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id,
						IPv4Data: v4Data("10.10.1.0/24"),
						IPv6Data: []*network.IPAMData{{AddressSpace: driver.CalicoLocalAddressSpace, Pool: "fd00:10:0:1::/64", Gateway: "::/0"}},
						Options: map[string]interface{}{
							"com.docker.network.enable_ipv6": true,
							"com.docker.network.generic":     map[string]interface{}{"mtu": "1400", "foo": "bar"},
						}}
				},
				want: &datastore.Network{
					Pools:    []string{"10.10.0.0/16", "fd00:10::/48"},
					Subnets:  []string{"10.10.1.0/24", "fd00:10:0:1::/64"},
					Gateways: []string{"0.0.0.0/0", "::/0"},
					IPv6:     true,
					Options:  map[string]string{"com.docker.network.enable_ipv6": "true", "mtu": "1400", "foo": "bar"},
				},
			},
			{
				name:   "without an IPAM the subnets are the pools",
				noIPAM: true,
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("10.10.1.0/24")}
				},
				want: &datastore.Network{Pools: []string{"10.10.1.0/24"}, Subnets: []string{"10.10.1.0/24"}, Gateways: []string{"0.0.0.0/0"}},
			},
			{
				name: "global address space",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: []*network.IPAMData{{AddressSpace: driver.CalicoGlobalAddressSpace, Pool: "0.0.0.0/0"}}}
				},
				want: &datastore.Network{Subnets: []string{"0.0.0.0/0"}},
			},
			{
				name: "foreign IPAM",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: []*network.IPAMData{{AddressSpace: "LocalDefault", Pool: "172.18.0.0/16", Gateway: "172.18.0.1/16"}}}
				},
				wantErr: []error{driver.ErrForeignIPAM},
				wantMsg: []string{"network driver calico needs --ipam-driver calico-ipam"},
			},
			{
				name: "foreign IPAM on the IPv6 side",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("0.0.0.0/0"), IPv6Data: []*network.IPAMData{{AddressSpace: "LocalDefault", Pool: "fd99::/64"}}}
				},
				wantErr: []error{driver.ErrForeignIPAM},
			},
			{
				name:    "no IPv4 data",
				req:     func(id string) *network.CreateNetworkRequest { return &network.CreateNetworkRequest{NetworkID: id} },
				wantErr: []error{driver.ErrInvalidRequest},
				wantMsg: []string{"no IPv4 address pool"},
			},
			{
				name: "bad pool CIDR",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("10.10.1.0/40")}
				},
				wantErr: []error{driver.ErrInvalidRequest},
			},
			{
				name: "subnet whose pool is gone",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("172.20.0.0/24")}
				},
				wantErr: []error{ipam.ErrPoolNotFound},
			},
			{
				name: "no network id",
				req: func(id string) *network.CreateNetworkRequest {
					return &network.CreateNetworkRequest{IPv4Data: v4Data("0.0.0.0/0")}
				},
				wantErr: []error{driver.ErrInvalidRequest},
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, m.Store)
				if tc.noIPAM {
					e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{})
				}
				id := newID('a')
				err := e.nd.CreateNetwork(ctx, tc.req(id))
				checkErr(t, err, tc.wantErr, tc.wantMsg)
				got, ok := e.network(t, id)
				if tc.want == nil {
					if ok {
						t.Fatalf("failed CreateNetwork recorded %+v", got)
					}
					return
				}
				want := *tc.want
				want.ID = id
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("record = %+v\nwant     %+v", got, want)
				}
			})
		}
	})

	t.Run("duplicate", func(t *testing.T) {
		e := newEnv(t, m.Store)
		id := newID('a')
		req := &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("0.0.0.0/0")}
		if err := e.nd.CreateNetwork(ctx, req); err != nil {
			t.Fatal(err)
		}
		err := e.nd.CreateNetwork(ctx, req)
		checkErr(t, err, []error{driver.ErrAlreadyExists}, []string{id[:12], "already exists"})
	})

	t.Run("DeleteNetwork", func(t *testing.T) {
		e := newEnv(t, m.Store)
		id := e.createNetwork(t, false)
		if err := e.nd.DeleteNetwork(ctx, &network.DeleteNetworkRequest{NetworkID: id}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.network(t, id); ok {
			t.Fatal("network still recorded")
		}
		// Docker retries: deleting again, or an unknown id, is fine.
		if err := e.nd.DeleteNetwork(ctx, &network.DeleteNetworkRequest{NetworkID: id}); err != nil {
			t.Fatalf("second delete: %v", err)
		}
		if err := e.nd.DeleteNetwork(ctx, &network.DeleteNetworkRequest{}); !errors.Is(err, driver.ErrInvalidRequest) {
			t.Fatalf("delete without id: %v", err)
		}
	})
}

func TestEndpoints(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()

	t.Run("CreateEndpoint", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, true)
		dup := e.createEndpoint(t, netID, "10.10.1.9/32", "")
		unknownNetwork := newID('a')
		tests := []struct {
			name     string
			network  string // netID when empty
			endpoint string // a fresh id when empty
			iface    *network.EndpointInterface
			wantResp *network.CreateEndpointResponse
			wantRec  *datastore.Endpoint // ID, Network, Node, HostIfName filled in
			wantErr  []error
			wantMsg  []string
		}{
			{
				name:     "IPv4",
				iface:    &network.EndpointInterface{Address: "10.10.1.5/24"},
				wantResp: &network.CreateEndpointResponse{Interface: &network.EndpointInterface{MacAddress: "ee:ee:ee:ee:ee:ee"}},
				wantRec:  &datastore.Endpoint{IPv4: "10.10.1.5/32", MAC: "ee:ee:ee:ee:ee:ee"},
			},
			{
				name:     "dual stack",
				iface:    &network.EndpointInterface{Address: "10.10.1.6/32", AddressIPv6: "fd00:10:0:1::6/128"},
				wantResp: &network.CreateEndpointResponse{Interface: &network.EndpointInterface{MacAddress: "ee:ee:ee:ee:ee:ee"}},
				wantRec:  &datastore.Endpoint{IPv4: "10.10.1.6/32", IPv6: "fd00:10:0:1::6/128", MAC: "ee:ee:ee:ee:ee:ee"},
			},
			{
				name:     "Docker chose the MAC: not echoed",
				iface:    &network.EndpointInterface{Address: "10.10.1.7/32", MacAddress: "02:42:0A:0A:01:07"},
				wantResp: &network.CreateEndpointResponse{},
				wantRec:  &datastore.Endpoint{IPv4: "10.10.1.7/32", MAC: "02:42:0a:0a:01:07"},
			},
			{
				name:    "unknown network",
				network: unknownNetwork,
				iface:   &network.EndpointInterface{Address: "10.10.1.8/32"},
				wantErr: []error{driver.ErrNetworkNotFound, datastore.ErrNotFound},
			},
			{
				name:    "no interface",
				wantErr: []error{driver.ErrInvalidRequest},
				wantMsg: []string{"no IP address"},
			},
			{
				name:    "no address",
				iface:   &network.EndpointInterface{MacAddress: "02:42:0a:0a:01:07"},
				wantErr: []error{driver.ErrInvalidRequest},
			},
			{
				name:    "bad address",
				iface:   &network.EndpointInterface{Address: "10.10.1.300/32"},
				wantErr: []error{driver.ErrInvalidRequest},
			},
			{
				name:    "IPv6 in the IPv4 field",
				iface:   &network.EndpointInterface{Address: "fd00:10::1/128"},
				wantErr: []error{driver.ErrInvalidRequest},
			},
			{
				name:    "bad MAC",
				iface:   &network.EndpointInterface{Address: "10.10.1.8/32", MacAddress: "nope"},
				wantErr: []error{driver.ErrInvalidRequest},
			},
			{
				name:     "duplicate",
				endpoint: dup,
				iface:    &network.EndpointInterface{Address: "10.10.1.9/32"},
				wantErr:  []error{driver.ErrAlreadyExists},
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				id := newID('e')
				req := &network.CreateEndpointRequest{NetworkID: cmp.Or(tc.network, netID), EndpointID: cmp.Or(tc.endpoint, id), Interface: tc.iface}
				resp, err := e.nd.CreateEndpoint(ctx, req)
				checkErr(t, err, tc.wantErr, tc.wantMsg)
				if err != nil {
					if req.EndpointID == id {
						if ep, ok := e.endpoint(t, id); ok {
							t.Fatalf("failed CreateEndpoint recorded %+v", ep)
						}
					}
					return
				}
				if !reflect.DeepEqual(resp, tc.wantResp) {
					t.Errorf("response = %+v, want %+v", resp, tc.wantResp)
				}
				if resp.Interface != nil && (resp.Interface.Address != "" || resp.Interface.AddressIPv6 != "") {
					t.Errorf("response echoes the address: %+v", resp.Interface)
				}
				got, _ := e.endpoint(t, id)
				want := *tc.wantRec
				want.ID, want.Network, want.Node, want.HostIfName = id, netID, testHost, dataplane.HostIfName(id)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("record = %+v\nwant     %+v", got, want)
				}
			})
		}
	})

	t.Run("EndpointInfo", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, true)
		id := e.createEndpoint(t, netID, "10.10.1.20/32", "fd00:10:0:1::20/128")
		info, err := e.nd.EndpointInfo(ctx, &network.InfoRequest{NetworkID: netID, EndpointID: id})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"hostIfName": dataplane.HostIfName(id), "ips": "10.10.1.20/32,fd00:10:0:1::20/128", "mac": driver.FixedMAC, "node": testHost}
		if !reflect.DeepEqual(info.Value, want) {
			t.Errorf("Value = %v, want %v", info.Value, want)
		}
		_, err = e.nd.EndpointInfo(ctx, &network.InfoRequest{NetworkID: netID, EndpointID: newID('e')})
		checkErr(t, err, []error{driver.ErrEndpointNotFound}, []string{"not known on host " + testHost})
	})

	t.Run("DeleteEndpoint", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.30/32", "")
		if err := e.nd.DeleteEndpoint(ctx, &network.DeleteEndpointRequest{NetworkID: netID, EndpointID: id}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.endpoint(t, id); ok {
			t.Fatal("endpoint still recorded")
		}
		if n := len(e.dp.Removals()); n != 0 {
			t.Errorf("never-joined endpoint: %d RemoveWorkload calls", n)
		}
		for _, eid := range []string{id, newID('e')} {
			if err := e.nd.DeleteEndpoint(ctx, &network.DeleteEndpointRequest{NetworkID: netID, EndpointID: eid}); err != nil {
				t.Fatalf("idempotent delete: %v", err)
			}
		}
	})

	t.Run("DeleteEndpoint of a joined endpoint removes its veth", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.31/32", "")
		if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: "/var/run/docker/netns/x"}); err != nil {
			t.Fatal(err)
		}
		if err := e.nd.DeleteEndpoint(ctx, &network.DeleteEndpointRequest{NetworkID: netID, EndpointID: id}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.dp.Workload(id); ok {
			t.Fatal("veth left behind")
		}
	})
}

func TestJoinLeave(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	const sandbox = "/var/run/docker/netns/0123456789ab"

	t.Run("Join IPv4", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.40/32", "")
		resp, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		if err != nil {
			t.Fatal(err)
		}
		want := &network.JoinResponse{
			InterfaceName: network.InterfaceName{SrcName: dataplane.TempIfName(id), DstPrefix: "eth"},
			Gateway:       "169.254.1.1",
			StaticRoutes: []*network.StaticRoute{
				{Destination: "169.254.1.1/32", RouteType: 1},
				{Destination: "10.10.1.0/24", RouteType: 0, NextHop: "169.254.1.1"},
			},
			DisableGatewayService: true,
		}
		if !reflect.DeepEqual(resp, want) {
			t.Errorf("Join = %+v, want %+v", resp, want)
		}
		w, ok := e.dp.Workload(id)
		wantW := dataplane.Workload{
			EndpointID: id, HostIfName: dataplane.HostIfName(id), TempIfName: dataplane.TempIfName(id),
			MAC: net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}, IPv4: mustNet("10.10.1.40/32"), MTU: 1400,
		}
		if !ok || !reflect.DeepEqual(w, wantW) {
			t.Errorf("workload = %+v, want %+v", w, wantW)
		}
		ep, _ := e.endpoint(t, id)
		if !ep.Joined || ep.Container != sandbox {
			t.Errorf("record after Join = %+v", ep)
		}

		// Leave undoes it.
		if err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: netID, EndpointID: id}); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.dp.Workload(id); ok {
			t.Error("veth still there after Leave")
		}
		rm := e.dp.Removals()
		if len(rm) != 1 || rm[0].EndpointID != id || len(rm[0].IPs) != 1 || rm[0].IPs[0].String() != "10.10.1.40/32" {
			t.Errorf("RemoveWorkload calls = %+v", rm)
		}
		ep, _ = e.endpoint(t, id)
		if ep.Joined || ep.Container != "" {
			t.Errorf("record after Leave = %+v", ep)
		}
		// Leave again, and of an unknown endpoint: fine.
		if err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: netID, EndpointID: id}); err != nil {
			t.Fatal(err)
		}
		if err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: netID, EndpointID: newID('e')}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Join IPv6", func(t *testing.T) {
		e := newEnv(t, m.Store)
		e.dp.LinkLocal = net.ParseIP("fe80::ecee:eeff:feee:eeee")
		netID := e.createNetwork(t, true)
		id := e.createEndpoint(t, netID, "10.10.1.41/32", "fd00:10:0:1::41/128")
		resp, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Gateway != "169.254.1.1" || resp.GatewayIPv6 != "fe80::ecee:eeff:feee:eeee" {
			t.Errorf("gateways = %q, %q", resp.Gateway, resp.GatewayIPv6)
		}
		wantRoutes := []*network.StaticRoute{
			{Destination: "169.254.1.1/32", RouteType: 1},
			{Destination: "10.10.1.0/24", NextHop: "169.254.1.1"},
			{Destination: "fe80::ecee:eeff:feee:eeee/128", RouteType: 1},
			{Destination: "fd00:10:0:1::/64", NextHop: "fe80::ecee:eeff:feee:eeee"},
		}
		if !reflect.DeepEqual(resp.StaticRoutes, wantRoutes) {
			t.Errorf("routes = %+v", resp.StaticRoutes)
		}
		w, _ := e.dp.Workload(id)
		if w.IPv6 == nil || w.IPv6.String() != "fd00:10:0:1::41/128" {
			t.Errorf("workload IPv6 = %v", w.IPv6)
		}
	})

	t.Run("Join of an unknown endpoint", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: newID('e'), SandboxKey: sandbox})
		checkErr(t, err, []error{driver.ErrEndpointNotFound}, nil)
		if e.dp.Adds() != 0 {
			t.Error("dataplane touched")
		}
	})

	t.Run("Join with the wrong network", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.42/32", "")
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: newID('a'), EndpointID: id, SandboxKey: sandbox})
		checkErr(t, err, []error{driver.ErrInvalidRequest}, nil)
	})

	t.Run("Join whose dataplane fails records nothing", func(t *testing.T) {
		e := newEnv(t, m.Store)
		e.dp.AddErr = errors.New("file exists")
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.43/32", "")
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		checkErr(t, err, nil, []string{"file exists", dataplane.HostIfName(id)})
		if ep, _ := e.endpoint(t, id); ep.Joined || ep.Container != "" {
			t.Errorf("record after failed Join = %+v", ep)
		}
	})

	// One read of this host's endpoints (the endpoint and the other
	// interfaces of its container) and one of the network (its subnets).
	t.Run("Join costs two datastore reads and one write", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.45/32", "")
		before := m.Store.Stats()
		if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox}); err != nil {
			t.Fatal(err)
		}
		after := m.Store.Stats()
		if reads, txns := after.Reads-before.Reads, after.Txns-before.Txns; reads != 2 || txns != 1 {
			t.Errorf("Join made %d reads and %d txns, want 2 and 1", reads, txns)
		}
	})

	t.Run("Join whose record changes meanwhile re-reads it and keeps the change", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.46/32", "")
		key := datastore.EndpointKey(testHost, id)
		e.dp.AfterAdd = func(dataplane.Workload) {
			var ep datastore.Endpoint
			rev, err := m.Store.GetJSON(ctx, key, &ep)
			if err != nil {
				t.Error(err)
				return
			}
			ep.MAC = "ee:ee:ee:ee:ee:01"
			if err := m.Store.Txn(ctx, datastore.Update(key, datastore.MustJSON(ep), rev)); err != nil {
				t.Error(err)
			}
		}
		if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox}); err != nil {
			t.Fatal(err)
		}
		ep, _ := e.endpoint(t, id)
		if !ep.Joined || ep.Container != sandbox || ep.MAC != "ee:ee:ee:ee:ee:01" {
			t.Errorf("record after a Join that raced an update = %+v", ep)
		}
	})

	t.Run("Join whose record update fails removes the workload", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.44/32", "")
		// The endpoint record vanishes between AddWorkload and the update
		// (a concurrent DeleteEndpoint).
		e.dp.AfterAdd = func(dataplane.Workload) {
			kv, err := m.Store.Get(ctx, datastore.EndpointKey(testHost, id))
			if err != nil {
				t.Error(err)
				return
			}
			if err := m.Store.Txn(ctx, datastore.Delete(kv.Key, kv.ModRevision)); err != nil {
				t.Error(err)
			}
		}
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		checkErr(t, err, []error{driver.ErrEndpointNotFound}, nil)
		if _, ok := e.dp.Workload(id); ok {
			t.Error("workload left behind")
		}
		if rm := e.dp.Removals(); len(rm) != 1 || rm[0].EndpointID != id {
			t.Errorf("RemoveWorkload calls = %+v", rm)
		}
	})

	t.Run("Join whose datastore goes away removes the workload", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.45/32", "")
		// A driver whose store is a client that dies right after AddWorkload.
		client := m.Client(t)
		nd := driver.NewNetworkDriver(client, e.dp, testHost, quietLog(), driver.Options{})
		e.dp.AfterAdd = func(dataplane.Workload) { _ = client.Close() }
		_, err := nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		if err == nil {
			t.Fatal("Join succeeded without a datastore")
		}
		if _, ok := e.dp.Workload(id); ok {
			t.Error("workload left behind")
		}
		if ep, _ := e.endpoint(t, id); ep.Joined {
			t.Errorf("record says joined: %+v", ep)
		}
	})

	t.Run("Join whose IPv6 gateway lookup fails removes the workload", func(t *testing.T) {
		e := newEnv(t, m.Store)
		e.dp.LinkLocalErr = errors.New("no link-local address")
		netID := e.createNetwork(t, true)
		id := e.createEndpoint(t, netID, "10.10.1.46/32", "fd00:10:0:1::46/128")
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox})
		checkErr(t, err, nil, []string{"IPv6 gateway"})
		if _, ok := e.dp.Workload(id); ok {
			t.Error("workload left behind")
		}
	})

	t.Run("Leave whose dataplane fails", func(t *testing.T) {
		e := newEnv(t, m.Store)
		netID := e.createNetwork(t, false)
		id := e.createEndpoint(t, netID, "10.10.1.47/32", "")
		if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: sandbox}); err != nil {
			t.Fatal(err)
		}
		e.dp.RemoveErr = errors.New("device busy")
		err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: netID, EndpointID: id})
		checkErr(t, err, nil, []string{"device busy"})
		if ep, _ := e.endpoint(t, id); !ep.Joined {
			t.Error("record says left although the veth is still there")
		}
	})
}

// A datastore that does not answer gives the user a message naming etcd.
func TestDatastoreUnreachable(t *testing.T) {
	cfg := datastore.Config{
		Endpoints:      []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.DeadPort(t))},
		RequestTimeout: 300 * time.Millisecond,
		DialTimeout:    300 * time.Millisecond,
	}
	store, err := datastore.Open(context.Background(), cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	nd := driver.NewNetworkDriver(store, drivertest.NewDataplane(), testHost, quietLog(), driver.Options{})
	err = nd.CreateNetwork(context.Background(), &network.CreateNetworkRequest{NetworkID: newID('a'), IPv4Data: v4Data("0.0.0.0/0")})
	checkErr(t, err, []error{datastore.ErrUnavailable}, nil)
	if !strings.HasPrefix(err.Error(), "calico datastore (etcd) unreachable") {
		t.Errorf("message %q does not start by naming the datastore", err)
	}
}
