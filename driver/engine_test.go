package driver_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// The real implementations satisfy the driver's interfaces.
var (
	_ driver.IPAM      = (*ipam.Engine)(nil)
	_ driver.Dataplane = (*dataplane.Linux)(nil)
)

// The IPAM driver against the real engine on a real etcd: the handles and
// arguments it passes are ones the engine accepts.
func TestIPAMDriverWithEngine(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	eng := immediateEngines(m)()
	d := driver.NewIPAMDriver(eng, testHost, quietLog())

	pool, err := d.RequestPool(ctx, &ipamapi.RequestPoolRequest{AddressSpace: driver.CalicoLocalAddressSpace})
	if err != nil || pool.PoolID != driver.PoolIDV4 {
		t.Fatalf("default RequestPool = %+v, %v", pool, err)
	}
	def, err := eng.EnsureDefaultPool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, defNet, _ := net.ParseCIDR(def.CIDR)

	auto, err := d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: driver.PoolIDV4})
	if err != nil {
		t.Fatalf("auto-assign: %v", err)
	}
	ip, n, err := net.ParseCIDR(auto.Address)
	if ones, _ := n.Mask.Size(); err != nil || ones != 32 || !defNet.Contains(ip) {
		t.Fatalf("auto-assigned %q, want a /32 in %s", auto.Address, def.CIDR)
	}

	// --subnet inside the default pool, then --ip in it.
	sub, err := d.RequestPool(ctx, &ipamapi.RequestPoolRequest{Pool: subnetOf(def.CIDR)})
	if err != nil {
		t.Fatalf("RequestPool --subnet: %v", err)
	}
	want := strings.TrimSuffix(sub.Pool, "0/24") + "77"
	got, err := d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: sub.PoolID, Address: want})
	if err != nil || got.Address != want+"/32" {
		t.Fatalf("--ip %s = %+v, %v", want, got, err)
	}
	// Another container asking for the same --ip, on this host or another,
	// is refused.
	other := driver.NewIPAMDriver(eng, "host-b", quietLog())
	for _, dd := range []*driver.IPAMDriver{d, other} {
		if _, err := dd.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: sub.PoolID, Address: want}); !errors.Is(err, ipam.ErrAddressInUse) {
			t.Fatalf("--ip of a taken address: %v", err)
		}
	}

	for _, a := range []string{want, ip.String(), ip.String(), "0.0.0.0", "203.0.113.1"} {
		if err := d.ReleaseAddress(ctx, &ipamapi.ReleaseAddressRequest{PoolID: sub.PoolID, Address: a}); err != nil {
			t.Fatalf("ReleaseAddress %s: %v", a, err)
		}
	}
	// Released addresses can be taken again.
	if _, err := other.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: sub.PoolID, Address: want}); err != nil {
		t.Fatalf("--ip after release: %v", err)
	}

	_, err = d.RequestPool(ctx, &ipamapi.RequestPoolRequest{Pool: "172.31.0.0/24"})
	if !errors.Is(err, ipam.ErrPoolNotFound) {
		t.Fatalf("subnet outside every pool: %v", err)
	}
	created, err := d.RequestPool(ctx, &ipamapi.RequestPoolRequest{Pool: "172.31.0.0/24", Options: map[string]string{driver.OptCreatePool: "true"}})
	if err != nil || created.PoolID != "172.31.0.0/24" {
		t.Fatalf("calico.create-pool: %+v, %v", created, err)
	}
	// The same request again (Docker restoring the network) finds the pool.
	if _, err := d.RequestPool(ctx, &ipamapi.RequestPoolRequest{Pool: "172.31.0.0/24", Options: map[string]string{driver.OptCreatePool: "true"}}); err != nil {
		t.Fatalf("repeated calico.create-pool: %v", err)
	}
	got, err = d.RequestAddress(ctx, &ipamapi.RequestAddressRequest{PoolID: created.PoolID})
	if err != nil || !strings.HasPrefix(got.Address, "172.31.0.") {
		t.Fatalf("auto-assign in a created pool: %+v, %v", got, err)
	}
}

// subnetOf is the first /24 of an IPv4 pool.
func subnetOf(cidr string) string {
	ip, _, _ := net.ParseCIDR(cidr)
	return (&net.IPNet{IP: ip.To4(), Mask: net.CIDRMask(24, 32)}).String()
}
