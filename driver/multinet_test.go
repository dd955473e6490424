package driver_test

import (
	"context"
	"net"
	"reflect"
	"testing"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/ports"
)

// createNetworkWith creates a network from the given IPv4 pool (subnet, or
// 0.0.0.0/0 for any pool) and extra options.
func (e *env) createNetworkWith(t *testing.T, pool string, opts map[string]interface{}) string {
	t.Helper()
	id := newID('a')
	req := &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data(pool), Options: opts}
	if err := e.nd.CreateNetwork(context.Background(), req); err != nil {
		t.Fatalf("CreateNetwork: %v", err)
	}
	return id
}

// TestJoinSeveralNetworks proves that the calico interfaces of one
// container never hand Docker colliding routes: each gets its own gateway
// (the lowest index its sandbox does not use), routes to its network's
// subnets (any pool: every pool) via that gateway unless another interface
// of the container routes them already, and an internal network gets no
// gateway, so never the default route.
func TestJoinSeveralNetworks(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	n1 := e.createNetworkWith(t, "10.10.1.0/24", nil)
	n2 := e.createNetworkWith(t, "10.10.2.0/24", nil)
	nAny := e.createNetworkWith(t, "0.0.0.0/0", nil)
	nSame := e.createNetworkWith(t, "10.10.1.0/24", nil) // overlaps n1
	nInt := e.createNetworkWith(t, "10.10.3.0/24", map[string]interface{}{ports.OptInternal: true})

	const sb1, sb2 = "/var/run/docker/netns/multi1", "/var/run/docker/netns/multi2"
	type step struct {
		name      string
		network   string
		addr      string
		sandbox   string
		leave     int // >0: leave the endpoint joined at that step (1-based) instead
		wantGW    string
		wantRoute []*network.StaticRoute
	}
	connected := func(gw string) *network.StaticRoute {
		return &network.StaticRoute{Destination: gw + "/32", RouteType: driver.RouteTypeConnected}
	}
	via := func(dst, gw string) *network.StaticRoute {
		return &network.StaticRoute{Destination: dst, RouteType: driver.RouteTypeNextHop, NextHop: gw}
	}
	steps := []step{
		{name: "first interface", network: n1, addr: "10.10.1.10/32", sandbox: sb1, wantGW: "169.254.1.1",
			wantRoute: []*network.StaticRoute{connected("169.254.1.1"), via("10.10.1.0/24", "169.254.1.1")}},
		{name: "second network: next gateway", network: n2, addr: "10.10.2.10/32", sandbox: sb1, wantGW: "169.254.1.2",
			wantRoute: []*network.StaticRoute{connected("169.254.1.2"), via("10.10.2.0/24", "169.254.1.2")}},
		{name: "another container starts again at 1", network: n2, addr: "10.10.2.11/32", sandbox: sb2, wantGW: "169.254.1.1",
			wantRoute: []*network.StaticRoute{connected("169.254.1.1"), via("10.10.2.0/24", "169.254.1.1")}},
		{name: "any-pool network routes the pools", network: nAny, addr: "10.10.9.10/32", sandbox: sb1, wantGW: "169.254.1.3",
			wantRoute: []*network.StaticRoute{connected("169.254.1.3"), via("10.10.0.0/16", "169.254.1.3")}},
		{name: "a subnet routed already is left out", network: nSame, addr: "10.10.1.11/32", sandbox: sb1, wantGW: "169.254.1.4",
			wantRoute: []*network.StaticRoute{connected("169.254.1.4")}},
		{name: "disconnect of the first", leave: 1},
		{name: "its gateway and subnet are free again", network: n1, addr: "10.10.1.12/32", sandbox: sb1, wantGW: "169.254.1.1",
			wantRoute: []*network.StaticRoute{connected("169.254.1.1"), via("10.10.1.0/24", "169.254.1.1")}},
		{name: "internal network: routes but no gateway", network: nInt, addr: "10.10.3.10/32", sandbox: sb1, wantGW: "",
			wantRoute: []*network.StaticRoute{connected("169.254.1.5"), via("10.10.3.0/24", "169.254.1.5")}},
	}
	joined := make([]struct{ net, ep string }, len(steps))
	for i, st := range steps {
		if st.leave > 0 {
			j := joined[st.leave-1]
			if err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: j.net, EndpointID: j.ep}); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			continue
		}
		id := e.createEndpoint(t, st.network, st.addr, "")
		joined[i].net, joined[i].ep = st.network, id
		resp, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: st.network, EndpointID: id, SandboxKey: st.sandbox})
		if err != nil {
			t.Fatalf("%s: Join: %v", st.name, err)
		}
		if resp.Gateway != st.wantGW || !reflect.DeepEqual(resp.StaticRoutes, st.wantRoute) {
			t.Errorf("%s: gateway %q routes %s; want %q %s", st.name, resp.Gateway, fmtRoutes(resp.StaticRoutes), st.wantGW, fmtRoutes(st.wantRoute))
		}
		if !resp.DisableGatewayService {
			t.Errorf("%s: DisableGatewayService not set", st.name)
		}
	}
}

// TestJoinSecondIPv6Gateway proves a dual-stack second interface gets its
// own IPv6 gateway on the host side too.
func TestJoinSecondIPv6Gateway(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	n1, n2 := e.createNetwork(t, true), e.createNetwork(t, true)
	const sb = "/var/run/docker/netns/multi6"
	for i, n := range []string{n1, n2} {
		id := e.createEndpoint(t, n, []string{"10.10.1.20/32", "10.10.1.21/32"}[i], []string{"fd00:10:0:1::20/128", "fd00:10:0:1::21/128"}[i])
		if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: n, EndpointID: id, SandboxKey: sb}); err != nil {
			t.Fatal(err)
		}
		w, _ := e.dp.Workload(id)
		want := []net.IP{nil, net.ParseIP("fe80::2")}[i]
		if !w.GatewayIPv6.Equal(want) {
			t.Errorf("interface %d: dataplane IPv6 gateway %v, want %v", i+1, w.GatewayIPv6, want)
		}
	}
}

func fmtRoutes(rs []*network.StaticRoute) string {
	s := "["
	for _, r := range rs {
		s += r.Destination
		if r.NextHop != "" {
			s += " via " + r.NextHop
		}
		s += "; "
	}
	return s + "]"
}

// TestAuxAddressesMarkedReserved proves CreateNetwork labels the
// reservations of --aux-address entries (and nothing else) as reserved,
// which reconcile and `ipam check` skip.
func TestAuxAddressesMarkedReserved(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	for _, ip := range []string{"10.10.5.250", "10.10.5.9"} {
		if err := e.ipam.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP(ip), Host: testHost, HandleID: "cnm." + ip, Attrs: map[string]string{ipam.AttrNode: testHost}}); err != nil {
			t.Fatal(err)
		}
	}
	req := &network.CreateNetworkRequest{NetworkID: newID('a'), IPv4Data: []*network.IPAMData{{
		AddressSpace: driver.CalicoLocalAddressSpace, Pool: "10.10.5.0/24", Gateway: "0.0.0.0/0",
		// Outside every pool: never reserved, nothing to mark.
		AuxAddresses: map[string]interface{}{"router": "10.10.5.250/24", "far": "172.16.0.1/24"},
	}}}
	if err := e.nd.CreateNetwork(ctx, req); err != nil {
		t.Fatal(err)
	}
	for ip, want := range map[string]string{"10.10.5.250": ipam.ReservedAux, "10.10.5.9": ""} {
		a, ok := e.ipam.Assigned(ip)
		if !ok || a.Attrs[ipam.AttrReserved] != want || a.Attrs[ipam.AttrNode] != testHost {
			t.Errorf("%s: assignment %+v (found %v), want %s=%q and the node kept", ip, a, ok, ipam.AttrReserved, want)
		}
	}
}

// TestJoinFindsPeersAcrossRestarts proves the sandbox index (which spares
// Join reading every endpoint record of the host) misses no interface of
// the container: endpoints joined by an earlier run of the driver are
// found by the first Join's full read, later ones from the index, and an
// endpoint that left, or whose record went away, no longer counts.
func TestJoinFindsPeersAcrossRestarts(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	const sb = "/var/run/docker/netns/restart1"
	nets := []string{
		e.createNetworkWith(t, "10.10.1.0/24", nil), e.createNetworkWith(t, "10.10.2.0/24", nil),
		e.createNetworkWith(t, "10.10.3.0/24", nil), e.createNetworkWith(t, "10.10.4.0/24", nil),
	}
	join := func(nd *driver.NetworkDriver, n int, addr string) (string, string) {
		t.Helper()
		id := e.createEndpoint(t, nets[n], addr, "")
		resp, err := nd.Join(ctx, &network.JoinRequest{NetworkID: nets[n], EndpointID: id, SandboxKey: sb})
		if err != nil {
			t.Fatal(err)
		}
		return id, resp.Gateway
	}
	first, gw := join(e.nd, 0, "10.10.1.10/32")
	if gw != "169.254.1.1" {
		t.Fatalf("first interface: gateway %s", gw)
	}
	// The daemon restarts: a new driver on the same datastore.
	restarted := driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{MTU: 1400, IPAM: e.ipam})
	steps := []struct {
		name   string
		before func()
		net    int
		addr   string
		wantGW string
	}{
		{name: "the earlier run's interface is found", net: 1, addr: "10.10.2.10/32", wantGW: "169.254.1.2"},
		{name: "and this run's", net: 2, addr: "10.10.3.10/32", wantGW: "169.254.1.3"},
		{name: "a left interface frees its gateway", before: func() {
			if err := restarted.Leave(ctx, &network.LeaveRequest{NetworkID: nets[0], EndpointID: first}); err != nil {
				t.Fatal(err)
			}
		}, net: 3, addr: "10.10.4.10/32", wantGW: "169.254.1.1"},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		if _, gw := join(restarted, st.net, st.addr); gw != st.wantGW {
			t.Errorf("%s: gateway %s, want %s", st.name, gw, st.wantGW)
		}
	}
}
