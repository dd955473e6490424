package driver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"regexp"
	"strings"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

const testHost = "host-a"

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func TestIPAMCapabilitiesAndAddressSpaces(t *testing.T) {
	d := driver.NewIPAMDriver(drivertest.NewIPAM(), testHost, quietLog())
	ctx := context.Background()
	caps, err := d.GetCapabilities(ctx)
	if err != nil || caps.RequiresMACAddress {
		t.Fatalf("GetCapabilities = %+v, %v; want RequiresMACAddress false", caps, err)
	}
	sp, err := d.GetDefaultAddressSpaces(ctx)
	if err != nil || sp.LocalDefaultAddressSpace != driver.CalicoLocalAddressSpace || sp.GlobalDefaultAddressSpace != driver.CalicoGlobalAddressSpace {
		t.Fatalf("GetDefaultAddressSpaces = %+v, %v", sp, err)
	}
	if err := d.ReleasePool(ctx, &ipamapi.ReleasePoolRequest{PoolID: "192.168.0.0/24"}); err != nil {
		t.Fatalf("ReleasePool: %v", err)
	}
}

func TestRequestPool(t *testing.T) {
	v4Pool := ipam.Pool{CIDR: "10.10.0.0/16"}
	v6Pool := ipam.Pool{CIDR: "fd00:10::/48"}
	offPool := ipam.Pool{CIDR: "10.99.0.0/16", Disabled: true}
	gw4 := map[string]string{"com.docker.network.gateway": "0.0.0.0/0"}
	gw6 := map[string]string{"com.docker.network.gateway": "::/0"}

	tests := []struct {
		name      string
		pools     []ipam.Pool
		ipamErr   error
		req       ipamapi.RequestPoolRequest
		want      *ipamapi.RequestPoolResponse
		wantErr   []error  // each must match errors.Is
		wantMsg   []string // substrings of the error
		wantPools []string // pools afterwards
		calls     []string // IPAM calls
	}{
		{
			name:      "default IPv4 pool created on demand",
			req:       ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace},
			want:      &ipamapi.RequestPoolResponse{PoolID: driver.PoolIDV4, Pool: "0.0.0.0/0", Data: gw4},
			wantPools: []string{"192.168.0.0/16"},
			calls:     []string{"EnsureDefaultPool"},
		},
		{
			name:  "default pool when one exists",
			pools: []ipam.Pool{v4Pool},
			req:   ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace},
			want:  &ipamapi.RequestPoolResponse{PoolID: driver.PoolIDV4, Pool: "0.0.0.0/0", Data: gw4},
		},
		{
			name:  "restored network passes 0.0.0.0/0 back",
			pools: []ipam.Pool{v4Pool},
			req:   ipamapi.RequestPoolRequest{Pool: "0.0.0.0/0"},
			want:  &ipamapi.RequestPoolResponse{PoolID: driver.PoolIDV4, Pool: "0.0.0.0/0", Data: gw4},
		},
		{
			name:    "default pool disabled",
			pools:   []ipam.Pool{offPool},
			req:     ipamapi.RequestPoolRequest{},
			wantErr: []error{ipam.ErrPoolDisabled},
			wantMsg: []string{"10.99.0.0/16 is disabled"},
		},
		{
			name:    "IPv6 without subnet",
			pools:   []ipam.Pool{v6Pool},
			req:     ipamapi.RequestPoolRequest{V6: true},
			wantErr: []error{driver.ErrInvalidRequest},
			wantMsg: []string{"--subnet", "IPv6"},
			calls:   []string{},
		},
		{
			name:    "IPv6 restored with ::/0",
			req:     ipamapi.RequestPoolRequest{V6: true, Pool: "::/0"},
			wantErr: []error{driver.ErrInvalidRequest},
		},
		{
			name:  "subnet equal to a pool",
			pools: []ipam.Pool{v4Pool},
			req:   ipamapi.RequestPoolRequest{Pool: "10.10.0.0/16"},
			want:  &ipamapi.RequestPoolResponse{PoolID: "10.10.0.0/16", Pool: "10.10.0.0/16", Data: gw4},
			calls: []string{"FindPool"},
		},
		{
			name:  "subnet inside a pool, not canonical",
			pools: []ipam.Pool{v4Pool},
			req:   ipamapi.RequestPoolRequest{Pool: "10.10.3.7/24"},
			want:  &ipamapi.RequestPoolResponse{PoolID: "10.10.3.0/24", Pool: "10.10.3.0/24", Data: gw4},
		},
		{
			name:  "IPv6 subnet in an IPv6 pool",
			pools: []ipam.Pool{v4Pool, v6Pool},
			req:   ipamapi.RequestPoolRequest{Pool: "fd00:10:0:1::/64", V6: true},
			want:  &ipamapi.RequestPoolResponse{PoolID: "fd00:10:0:1::/64", Pool: "fd00:10:0:1::/64", Data: gw6},
		},
		{
			name:    "subnet in no pool",
			pools:   []ipam.Pool{v4Pool},
			req:     ipamapi.RequestPoolRequest{Pool: "172.16.0.0/24"},
			wantErr: []error{ipam.ErrPoolNotFound},
			wantMsg: []string{"calico-cnm pool add 172.16.0.0/24", "calico.create-pool=true"},
		},
		{
			name:      "subnet in no pool, calico.create-pool",
			pools:     []ipam.Pool{v4Pool},
			req:       ipamapi.RequestPoolRequest{Pool: "172.16.0.0/24", Options: map[string]string{"calico.create-pool": "true"}},
			want:      &ipamapi.RequestPoolResponse{PoolID: "172.16.0.0/24", Pool: "172.16.0.0/24", Data: gw4},
			wantPools: []string{"10.10.0.0/16", "172.16.0.0/24"},
			calls:     []string{"FindPool", "EnsureDefaultPool", "FindPool", "AddPool"},
		},
		{
			name:    "calico.create-pool overlapping a pool",
			pools:   []ipam.Pool{v4Pool},
			req:     ipamapi.RequestPoolRequest{Pool: "10.0.0.0/8", Options: map[string]string{"calico.create-pool": "true"}},
			wantErr: []error{ipam.ErrPoolOverlap},
			wantMsg: []string{"overlaps"},
		},
		{
			name:    "subnet in a disabled pool",
			pools:   []ipam.Pool{offPool},
			req:     ipamapi.RequestPoolRequest{Pool: "10.99.1.0/24"},
			wantErr: []error{ipam.ErrPoolDisabled},
		},
		{
			name:    "bad CIDR",
			req:     ipamapi.RequestPoolRequest{Pool: "10.10.0.0/33"},
			wantErr: []error{ipam.ErrInvalidCIDR, driver.ErrInvalidRequest},
			wantMsg: []string{`--subnet "10.10.0.0/33"`},
		},
		{
			name:    "IPv4 subnet for the IPv6 side",
			req:     ipamapi.RequestPoolRequest{Pool: "10.10.0.0/24", V6: true},
			wantErr: []error{driver.ErrInvalidRequest},
		},
		{
			name:    "ip-range",
			pools:   []ipam.Pool{v4Pool},
			req:     ipamapi.RequestPoolRequest{Pool: "10.10.0.0/16", SubPool: "10.10.1.0/24"},
			wantErr: []error{driver.ErrNotSupported},
			wantMsg: []string{"--ip-range"},
		},
		{
			name:    "unknown calico option",
			req:     ipamapi.RequestPoolRequest{Options: map[string]string{"calico.bogus": "1"}},
			wantErr: []error{driver.ErrInvalidRequest},
			wantMsg: []string{"calico.bogus"},
		},
		{
			name:  "foreign options are ignored",
			pools: []ipam.Pool{v4Pool},
			req:   ipamapi.RequestPoolRequest{Options: map[string]string{"com.example.x": "1"}},
			want:  &ipamapi.RequestPoolResponse{PoolID: driver.PoolIDV4, Pool: "0.0.0.0/0", Data: gw4},
		},
		{
			name:    "create-pool not a bool",
			req:     ipamapi.RequestPoolRequest{Pool: "172.16.0.0/24", Options: map[string]string{"calico.create-pool": "yes please"}},
			wantErr: []error{driver.ErrInvalidRequest},
		},
		{
			name:    "create-pool without subnet",
			req:     ipamapi.RequestPoolRequest{Options: map[string]string{"calico.create-pool": "true"}},
			wantErr: []error{driver.ErrInvalidRequest},
		},
		{
			name:    "datastore down",
			ipamErr: fmt.Errorf("%w: no answer from etcd within 10s", datastore.ErrUnavailable),
			req:     ipamapi.RequestPoolRequest{},
			wantErr: []error{datastore.ErrUnavailable},
			wantMsg: []string{"calico datastore (etcd) unreachable"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := drivertest.NewIPAM(tc.pools...)
			f.Err = tc.ipamErr
			d := driver.NewIPAMDriver(f, testHost, quietLog())
			resp, err := d.RequestPool(context.Background(), &tc.req)
			checkErr(t, err, tc.wantErr, tc.wantMsg)
			if tc.want != nil && !reflect.DeepEqual(resp, tc.want) {
				t.Errorf("RequestPool = %+v, want %+v", resp, tc.want)
			}
			if tc.wantPools != nil {
				var got []string
				for _, p := range f.Pools() {
					got = append(got, p.CIDR)
				}
				if !reflect.DeepEqual(got, tc.wantPools) {
					t.Errorf("pools = %v, want %v", got, tc.wantPools)
				}
			}
			if tc.calls != nil {
				if got := f.Calls(); !reflect.DeepEqual(got, tc.calls) && !(len(got) == 0 && len(tc.calls) == 0) {
					t.Errorf("IPAM calls = %v, want %v", got, tc.calls)
				}
			}
		})
	}
}

func TestRequestPoolCreatedPoolOptions(t *testing.T) {
	f := drivertest.NewIPAM()
	d := driver.NewIPAMDriver(f, testHost, quietLog())
	_, err := d.RequestPool(context.Background(), &ipamapi.RequestPoolRequest{
		Pool:    "172.16.0.0/28",
		Options: map[string]string{"calico.create-pool": "true", "calico.nat-outgoing": "true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The default pool appears too: it is created on first use.
	want := []ipam.Pool{{CIDR: ipam.DefaultPoolIPv4, BlockSize: 26, NATOutgoing: true}, {CIDR: "172.16.0.0/28", BlockSize: 28, NATOutgoing: true}}
	if got := f.Pools(); !reflect.DeepEqual(got, want) {
		t.Fatalf("pools = %+v, want %+v (block no larger than the subnet)", got, want)
	}
	_, err = d.RequestPool(context.Background(), &ipamapi.RequestPoolRequest{
		Pool: "172.17.0.0/24", Options: map[string]string{"calico.nat-outgoing": "true"},
	})
	checkErr(t, err, []error{driver.ErrInvalidRequest}, []string{"calico.create-pool"})
}

func checkErr(t *testing.T, err error, wantErr []error, wantMsg []string) {
	t.Helper()
	if len(wantErr) == 0 && len(wantMsg) == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error; want %v %q", wantErr, wantMsg)
	}
	for _, w := range wantErr {
		if !errors.Is(err, w) {
			t.Errorf("error %q is not %q", err, w)
		}
	}
	for _, m := range wantMsg {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q spans lines", err)
	}
}

func TestRequestAddress(t *testing.T) {
	pools := []ipam.Pool{{CIDR: "10.10.0.0/16"}, {CIDR: "fd00:10::/48"}, {CIDR: "10.99.0.0/16", Disabled: true}}
	gwOpt := map[string]string{"RequestAddressType": "com.docker.network.gateway"}
	tests := []struct {
		name     string
		prep     func(f *drivertest.IPAM)
		req      ipamapi.RequestAddressRequest
		want     string // Address
		wantErr  []error
		wantMsg  []string
		noCalls  bool   // virtual: IPAM untouched
		assigned string // address that must now be assigned, with its handle
	}{
		{name: "auto from any pool", req: ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4}, want: "10.10.0.0/32", assigned: "10.10.0.0"},
		{name: "auto within subnet", req: ipamapi.RequestAddressRequest{PoolID: "10.10.7.0/24"}, want: "10.10.7.0/32", assigned: "10.10.7.0"},
		{name: "auto IPv6", req: ipamapi.RequestAddressRequest{PoolID: "fd00:10:0:1::/64"}, want: "fd00:10:0:1::/128", assigned: "fd00:10:0:1::"},
		{name: "docker run --ip", req: ipamapi.RequestAddressRequest{PoolID: "10.10.7.0/24", Address: "10.10.7.42"}, want: "10.10.7.42/32", assigned: "10.10.7.42"},
		{name: "docker run --ip6", req: ipamapi.RequestAddressRequest{PoolID: "fd00:10:0:1::/64", Address: "fd00:10:0:1::42"}, want: "fd00:10:0:1::42/128", assigned: "fd00:10:0:1::42"},
		{
			name: "--ip in use",
			prep: func(f *drivertest.IPAM) {
				_ = f.AssignIP(context.Background(), ipam.AssignIPArgs{IP: net.ParseIP("10.10.7.42"), HandleID: "x"})
			},
			req:     ipamapi.RequestAddressRequest{PoolID: "10.10.7.0/24", Address: "10.10.7.42"},
			wantErr: []error{ipam.ErrAddressInUse},
			wantMsg: []string{"cannot assign address 10.10.7.42"},
		},
		{
			name:    "--ip outside the subnet",
			req:     ipamapi.RequestAddressRequest{PoolID: "10.10.7.0/24", Address: "10.10.8.1"},
			wantErr: []error{driver.ErrInvalidRequest, ipam.ErrNotInPool},
		},
		{
			name:    "--ip in no pool",
			req:     ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4, Address: "172.16.0.1"},
			wantErr: []error{ipam.ErrNotInPool},
		},
		{
			name:    "--ip in a disabled pool",
			req:     ipamapi.RequestAddressRequest{PoolID: "10.99.0.0/16", Address: "10.99.0.5"},
			wantErr: []error{ipam.ErrPoolDisabled},
		},
		{
			name:    "auto from a disabled pool",
			req:     ipamapi.RequestAddressRequest{PoolID: "10.99.0.0/16"},
			wantErr: []error{ipam.ErrPoolDisabled},
		},
		{
			name: "exhausted",
			req:  ipamapi.RequestAddressRequest{PoolID: "10.10.0.0/31"},
			prep: func(f *drivertest.IPAM) {
				_, _ = f.AutoAssign(context.Background(), ipam.AutoAssignArgs{Within: mustNet("10.10.0.0/31")})
				_, _ = f.AutoAssign(context.Background(), ipam.AutoAssignArgs{Within: mustNet("10.10.0.0/31")})
			},
			wantErr: []error{ipam.ErrExhausted},
			wantMsg: []string{"cannot assign an IPv4 address from subnet 10.10.0.0/31"},
		},
		{name: "bad address", req: ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4, Address: "10.10.1"}, wantErr: []error{driver.ErrInvalidRequest}},
		{name: "IPv6 address for an IPv4 pool", req: ipamapi.RequestAddressRequest{PoolID: "10.10.0.0/16", Address: "fd00:10::1"}, wantErr: []error{driver.ErrInvalidRequest}},
		{name: "foreign pool id", req: ipamapi.RequestAddressRequest{PoolID: "default/10.10.0.0/16"}, wantErr: []error{driver.ErrInvalidRequest}, wantMsg: []string{"calico-ipam"}},
		{name: "gateway of the default network", req: ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4, Options: gwOpt}, want: "0.0.0.0/0", noCalls: true},
		{name: "gateway on restore (0.0.0.0)", req: ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4, Address: "0.0.0.0", Options: gwOpt}, want: "0.0.0.0/0", noCalls: true},
		{name: "--gateway of a subnet network", req: ipamapi.RequestAddressRequest{PoolID: "10.10.7.0/24", Address: "10.10.7.1", Options: gwOpt}, want: "0.0.0.0/0", noCalls: true},
		{name: "IPv6 gateway", req: ipamapi.RequestAddressRequest{PoolID: "fd00:10:0:1::/64", Options: gwOpt}, want: "::/0", noCalls: true},
		{
			name:    "datastore down",
			prep:    func(f *drivertest.IPAM) { f.Err = fmt.Errorf("%w: connection refused", datastore.ErrUnavailable) },
			req:     ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4},
			wantErr: []error{datastore.ErrUnavailable},
			wantMsg: []string{"calico datastore (etcd) unreachable"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := drivertest.NewIPAM(pools...)
			if tc.prep != nil {
				tc.prep(f)
			}
			f.ResetCalls()
			d := driver.NewIPAMDriver(f, testHost, quietLog())
			resp, err := d.RequestAddress(context.Background(), &tc.req)
			checkErr(t, err, tc.wantErr, tc.wantMsg)
			if err != nil {
				return
			}
			if resp.Address != tc.want {
				t.Errorf("Address = %q, want %q", resp.Address, tc.want)
			}
			if tc.noCalls && len(f.Calls()) != 0 {
				t.Errorf("gateway request reached the IPAM: %v", f.Calls())
			}
			if tc.assigned != "" {
				a, ok := f.Assigned(tc.assigned)
				if !ok {
					t.Fatalf("%s not assigned", tc.assigned)
				}
				wantAttrs := map[string]string{"node": testHost, "pool": tc.req.PoolID}
				if a.Host != testHost || !reflect.DeepEqual(a.Attrs, wantAttrs) {
					t.Errorf("assignment = %+v, want host %s attrs %v", a, testHost, wantAttrs)
				}
				if !handleRE.MatchString(a.HandleID) {
					t.Errorf("handle = %q, want cnm.<16 hex>", a.HandleID)
				}
			}
		})
	}
}

func mustNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

var handleRE = regexp.MustCompile(`^cnm\.[0-9a-f]{16}$`)

// Two requests for the same --ip must not share a handle: the engine would
// take the second for a retry of the first and hand the address out twice.
func TestHandlesAreUniquePerRequest(t *testing.T) {
	f := drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"})
	d := driver.NewIPAMDriver(f, testHost, quietLog())
	ctx := context.Background()
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		resp, err := d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4})
		if err != nil {
			t.Fatal(err)
		}
		ip, _, _ := net.ParseCIDR(resp.Address)
		a, _ := f.Assigned(ip.String())
		if seen[a.HandleID] || !handleRE.MatchString(a.HandleID) {
			t.Fatalf("handle %q repeated or malformed", a.HandleID)
		}
		seen[a.HandleID] = true
	}
}

func TestReleaseAddress(t *testing.T) {
	tests := []struct {
		name    string
		addr    string
		virtual bool
		down    bool
		wantErr []error
	}{
		{name: "assigned address", addr: "10.10.0.5"},
		{name: "already free", addr: "10.10.0.6"},
		{name: "IPv6", addr: "fd00:10::5"},
		{name: "virtual gateway", addr: "0.0.0.0", virtual: true},
		{name: "virtual IPv6 gateway", addr: "::", virtual: true},
		{name: "link-local gateway", addr: "169.254.1.1", virtual: true},
		{name: "garbage", addr: "ten", wantErr: []error{driver.ErrInvalidRequest}},
		{name: "outside every pool", addr: "172.31.0.1"},
		{name: "datastore down", addr: "10.10.0.5", down: true, wantErr: []error{datastore.ErrUnavailable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}, ipam.Pool{CIDR: "fd00:10::/48"})
			ctx := context.Background()
			_ = f.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP("10.10.0.5"), HandleID: "h"})
			_ = f.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP("fd00:10::5"), HandleID: "h6"})
			f.ResetCalls()
			if tc.down {
				f.Err = fmt.Errorf("%w: connection refused", datastore.ErrUnavailable)
			}
			d := driver.NewIPAMDriver(f, testHost, quietLog())
			err := d.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: driver.PoolIDV4, Address: tc.addr})
			checkErr(t, err, tc.wantErr, nil)
			if tc.wantErr != nil {
				return
			}
			if tc.virtual {
				if len(f.Calls()) != 0 {
					t.Errorf("virtual gateway release reached the IPAM: %v", f.Calls())
				}
				return
			}
			if _, ok := f.Assigned(tc.addr); ok {
				t.Errorf("%s still assigned", tc.addr)
			}
		})
	}
}

// A full round: the assigned address of an AutoAssign can be given back.
func TestAutoAssignReleaseRoundTrip(t *testing.T) {
	f := drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"})
	d := driver.NewIPAMDriver(f, testHost, quietLog())
	ctx := context.Background()
	resp, err := d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4})
	if err != nil {
		t.Fatal(err)
	}
	ip, _, _ := net.ParseCIDR(resp.Address)
	if err := d.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: driver.PoolIDV4, Address: ip.String()}); err != nil {
		t.Fatal(err)
	}
	if len(f.AssignedIPs()) != 0 {
		t.Fatalf("still assigned: %v", f.AssignedIPs())
	}
}
