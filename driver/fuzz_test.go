package driver_test

import (
	"context"
	"net"
	"reflect"
	"strings"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"

	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fuzzIPAM is a fresh fake per input, so inputs do not depend on each other.
func fuzzIPAM() *drivertest.IPAM {
	f := drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}, ipam.Pool{CIDR: "fd00:10::/48"}, ipam.Pool{CIDR: "10.20.0.0/16", Disabled: true})
	return f
}

// parseOpts turns "k=v" lines into Docker's --ipam-opt map.
func parseOpts(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

// oneLine fails unless err is a non-empty message on one line. Messages
// quote what the user typed, so a line break the input itself carried (which
// Docker's own validation would have refused) is not counted.
func oneLine(t *testing.T, what string, err error, inputs ...string) {
	t.Helper()
	for _, in := range inputs {
		if strings.ContainsAny(in, "\r\n") {
			if err.Error() == "" {
				t.Fatalf("%s: empty error", what)
			}
			return
		}
	}
	if msg := err.Error(); msg == "" || strings.Contains(msg, "\n") {
		t.Fatalf("%s: error is not one sentence on one line: %q", what, msg)
	}
}

// FuzzRequestPool feeds RequestPool (docker network create --subnet X
// --ip-range Y --ipam-opt k=v [--ipv6]) arbitrary subnets, sub-pools and
// options. Never a panic; a rejection is one line and adds no pool; an
// accepted request answers a PoolID that RequestAddress understands, the
// virtual gateway of the right family, and adds a pool only when asked to
// with calico.create-pool=true.
func FuzzRequestPool(f *testing.F) {
	f.Fuzz(func(t *testing.T, pool, subPool string, v6 bool, opts string) {
		im := fuzzIPAM()
		d := driver.NewIPAMDriver(im, testHost, quietLog())
		ctx := context.Background()
		before := im.Pools()
		req := &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace, Pool: pool, SubPool: subPool, V6: v6, Options: parseOpts(opts)}
		resp, err := d.RequestPool(ctx, req)
		after := im.Pools()
		if err != nil {
			oneLine(t, "RequestPool", err, pool, subPool, opts)
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("rejected RequestPool(%+v) (%v) changed the pools: %v -> %v", req, err, before, after)
			}
			return
		}
		if subPool != "" {
			t.Fatalf("RequestPool accepted --ip-range %q, which calico-ipam does not support", subPool)
		}
		wantGW := driver.VirtualGatewayIPv4
		if v6 {
			wantGW = driver.VirtualGatewayIPv6
		}
		if resp.Data[driver.GatewayDataKey] != wantGW {
			t.Fatalf("RequestPool(%+v) gateway %q, want %q", req, resp.Data[driver.GatewayDataKey], wantGW)
		}
		created := parseOpts(opts)[driver.OptCreatePool]
		if resp.PoolID == driver.PoolIDV4 {
			if v6 || resp.Pool != driver.VirtualGatewayIPv4 || !reflect.DeepEqual(before, after) {
				t.Fatalf("RequestPool(%+v) = %+v (pools %v -> %v): the any-pool answer is IPv4-only, 0.0.0.0/0 and adds nothing", req, resp, before, after)
			}
			return
		}
		_, subnet, perr := net.ParseCIDR(resp.PoolID)
		if perr != nil || subnet.String() != resp.PoolID || resp.Pool != resp.PoolID || (subnet.IP.To4() == nil) != v6 {
			t.Fatalf("RequestPool(%+v) answered PoolID %q Pool %q: want the canonical subnet of the request's family", req, resp.PoolID, resp.Pool)
		}
		p, ferr := im.FindPool(ctx, subnet)
		if ferr != nil || p.Disabled {
			t.Fatalf("RequestPool(%+v) accepted %s, which is in no enabled pool (%+v, %v)", req, subnet, p, ferr)
		}
		if len(after) != len(before) && (len(after) != len(before)+1 || created == "" || after[len(after)-1].CIDR != resp.PoolID) {
			t.Fatalf("RequestPool(%+v) changed the pools without calico.create-pool: %v -> %v", req, before, after)
		}
		// The PoolID must be usable for addresses.
		if _, err := d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: resp.PoolID}); err != nil {
			t.Fatalf("RequestAddress on the PoolID %q that RequestPool answered: %v", resp.PoolID, err)
		}
	})
}

// FuzzRequestAddress feeds RequestAddress arbitrary PoolIDs, addresses and
// options (docker run --ip X, gateway requests). Never a panic; a rejection
// is one line and assigns nothing; an accepted container address is a /32
// (/128) inside the PoolID's subnet, newly assigned; a gateway request
// assigns nothing.
func FuzzRequestAddress(f *testing.F) {
	f.Fuzz(func(t *testing.T, poolID, address string, opts string) {
		im := fuzzIPAM()
		ctx := context.Background()
		if err := im.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP("10.10.0.1"), Host: testHost, HandleID: "taken"}); err != nil {
			t.Fatal(err)
		}
		d := driver.NewIPAMDriver(im, testHost, quietLog())
		before := im.AssignedIPs()
		req := &ipamapi.RequestAddressRequest{PoolID: poolID, Address: address, Options: parseOpts(opts)}
		resp, err := d.RequestAddress(ctx, req)
		after := im.AssignedIPs()
		if err != nil {
			oneLine(t, "RequestAddress", err, poolID, address, opts)
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("rejected RequestAddress(%+v) (%v) changed the assignments: %v -> %v", req, err, before, after)
			}
			return
		}
		if req.Options[driver.RequestAddressTypeKey] == driver.RequestAddressTypeGateway {
			if resp.Address != driver.VirtualGatewayIPv4 && resp.Address != driver.VirtualGatewayIPv6 {
				t.Fatalf("gateway RequestAddress(%+v) = %q, want the virtual gateway", req, resp.Address)
			}
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("gateway RequestAddress(%+v) assigned an address: %v -> %v", req, before, after)
			}
			return
		}
		ip, n, perr := net.ParseCIDR(resp.Address)
		if perr != nil {
			t.Fatalf("RequestAddress(%+v) = %q: not a CIDR", req, resp.Address)
		}
		if ones, bits := n.Mask.Size(); ones != bits {
			t.Fatalf("RequestAddress(%+v) = %q: want a /32 or /128", req, resp.Address)
		}
		if len(after) != len(before)+1 {
			t.Fatalf("RequestAddress(%+v) = %q but the assignments went %v -> %v", req, resp.Address, before, after)
		}
		if _, ok := im.Assigned(ip.String()); !ok {
			t.Fatalf("RequestAddress(%+v) = %q, which is not assigned", req, resp.Address)
		}
		if _, within, err := net.ParseCIDR(poolID); err == nil && !within.Contains(ip) {
			t.Fatalf("RequestAddress(%+v) = %q, outside the pool %s", req, resp.Address, within)
		}
		if req.Address != "" {
			want := net.ParseIP(req.Address)
			if want == nil {
				want, _, _ = net.ParseCIDR(req.Address)
			}
			if !want.Equal(ip) {
				t.Fatalf("RequestAddress for %q answered %q", req.Address, resp.Address)
			}
		}
	})
}

// FuzzReleaseAddress: arbitrary addresses never panic; a rejection is one
// line and frees nothing; after an accepted release the address is free.
func FuzzReleaseAddress(f *testing.F) {
	f.Fuzz(func(t *testing.T, poolID, address string) {
		im := fuzzIPAM()
		ctx := context.Background()
		for _, ip := range []string{"10.10.0.1", "fd00:10::5"} {
			if err := im.AssignIP(ctx, ipam.AssignIPArgs{IP: net.ParseIP(ip), Host: testHost, HandleID: "h" + ip}); err != nil {
				t.Fatal(err)
			}
		}
		d := driver.NewIPAMDriver(im, testHost, quietLog())
		before := im.AssignedIPs()
		err := d.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: poolID, Address: address})
		after := im.AssignedIPs()
		if err != nil {
			oneLine(t, "ReleaseAddress", err, poolID, address)
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("rejected ReleaseAddress(%q) (%v) changed the assignments: %v -> %v", address, err, before, after)
			}
			return
		}
		if len(before)-len(after) > 1 {
			t.Fatalf("ReleaseAddress(%q) freed several addresses: %v -> %v", address, before, after)
		}
		ip := net.ParseIP(address)
		if ip == nil {
			ip, _, _ = net.ParseCIDR(address)
		}
		if ip == nil {
			t.Fatalf("ReleaseAddress accepted %q, which is not an address", address)
		}
		if _, still := im.Assigned(ip.String()); still {
			t.Fatalf("ReleaseAddress(%q) succeeded but %s is still assigned", address, ip)
		}
	})
}
