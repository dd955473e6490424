package bandwidth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/internal/netnstest"
)

// newTestNetns makes a throw-away network namespace with one workload-like
// veth (host side cali + 11 hex) and returns a handle into it and the
// endpoint id. Everything goes when the test ends.
func newTestNetns(t testing.TB) (*netlink.Handle, string, string) {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b)
	h := netnstest.New(t, "bwtest", "the netlink shaping")
	host := "cali" + id[:11]
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = host, 1500
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "tmp" + id[:11]}); err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return h, id, host
}

// kernelShaping is what the kernel has of an endpoint's shaping.
type kernelShaping struct {
	vethTbf   *netlink.Tbf
	ingress   bool
	redirects bool // the ingress qdisc's filter sends to the ifb device
	ifb       netlink.Link
	ifbTbf    *netlink.Tbf
}

func readShaping(t *testing.T, h *netlink.Handle, id, host string) kernelShaping {
	t.Helper()
	var ks kernelShaping
	veth, err := h.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if ifb, err := h.LinkByName(IfbName(id)); err == nil {
		ks.ifb = ifb
	}
	qs, err := h.QdiscList(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		tbf, isTbf := q.(*netlink.Tbf)
		switch {
		case q.Attrs().LinkIndex == veth.Attrs().Index && isTbf && q.Attrs().Parent == netlink.HANDLE_ROOT:
			ks.vethTbf = tbf
		case q.Attrs().LinkIndex == veth.Attrs().Index && q.Type() == "ingress":
			ks.ingress = true
		case ks.ifb != nil && q.Attrs().LinkIndex == ks.ifb.Attrs().Index && isTbf:
			ks.ifbTbf = tbf
		}
	}
	if ks.ingress && ks.ifb != nil {
		fs, err := h.FilterList(veth, netlink.MakeHandle(0xffff, 0))
		if err != nil {
			t.Fatal(err)
		}
		ks.redirects = len(fs) == 1 && redirectsTo(fs[0], ks.ifb.Attrs().Index)
	}
	return ks
}

// TestShaperInNetns: Apply puts a tbf of the ingress rate on the veth and,
// for egress, an up ifb device with a tbf of the egress rate, fed by the
// veth's ingress qdisc; an update changes the rate in place; dropping a
// direction removes its parts; Remove and Sweep leave nothing.
func TestShaperInNetns(t *testing.T) {
	h, id, host := newTestNetns(t)
	s := NewShaper(h)
	ctx := context.Background()

	l := Limits{IngressRate: 50_000_000, EgressRate: 20_000_000, EgressBurst: 64 << 10}
	changed, err := s.Apply(ctx, id, host, l)
	if err != nil || !changed {
		t.Fatalf("Apply = %v, %v; want a change", changed, err)
	}
	ks := readShaping(t, h, id, host)
	if ks.vethTbf == nil || ks.vethTbf.Rate != 50_000_000/8 {
		t.Fatalf("veth tbf = %+v, want rate 50mbit", ks.vethTbf)
	}
	if ks.ifb == nil || ks.ifb.Type() != "ifb" || ks.ifb.Attrs().Flags&unix.IFF_UP == 0 {
		t.Fatalf("ifb device %s = %+v, want an ifb device that is up", IfbName(id), ks.ifb)
	}
	if ks.ifbTbf == nil || ks.ifbTbf.Rate != 20_000_000/8 || ks.ifbTbf.Buffer != netlink.Xmittime(20_000_000/8, 64<<10) {
		t.Fatalf("ifb tbf = %+v, want rate 20mbit, burst 64k", ks.ifbTbf)
	}
	if !ks.ingress || !ks.redirects {
		t.Fatalf("veth ingress qdisc %v, redirect to the ifb device %v; want both", ks.ingress, ks.redirects)
	}

	if changed, err := s.Apply(ctx, id, host, l); err != nil || changed {
		t.Fatalf("second Apply = %v, %v; want no change", changed, err)
	}

	l.IngressRate = 10_000_000
	if changed, err := s.Apply(ctx, id, host, l); err != nil || !changed {
		t.Fatalf("Apply of a new rate = %v, %v", changed, err)
	}
	if ks := readShaping(t, h, id, host); ks.vethTbf == nil || ks.vethTbf.Rate != 10_000_000/8 || !ks.redirects {
		t.Fatalf("after the update: %+v", ks)
	}

	if _, err := s.Apply(ctx, id, host, Limits{IngressRate: 10_000_000}); err != nil {
		t.Fatal(err)
	}
	if ks := readShaping(t, h, id, host); ks.ifb != nil || ks.ingress || ks.vethTbf == nil {
		t.Fatalf("egress limit dropped: want no ifb and no ingress qdisc but the veth tbf, got %+v", ks)
	}

	if _, err := s.Apply(ctx, id, host, l); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, id, host); err != nil {
		t.Fatal(err)
	}
	if ks := readShaping(t, h, id, host); ks.ifb != nil || ks.ingress || ks.vethTbf != nil {
		t.Fatalf("after Remove: %+v", ks)
	}
	if err := s.Remove(ctx, id, host); err != nil {
		t.Fatalf("Remove of nothing: %v", err)
	}

	// A crash left shaping behind: Sweep keeps what keep names only.
	if _, err := s.Apply(ctx, id, host, l); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx, map[string]bool{host: true, IfbName(id): true}, map[string]bool{host: true}); err != nil || n != 0 {
		t.Fatalf("Sweep keeping the endpoint = %d, %v", n, err)
	}
	// The veth of no endpoint of ours: its qdiscs are not ours either.
	if n, err := s.Sweep(ctx, map[string]bool{IfbName(id): true}, nil); err != nil || n != 0 {
		t.Fatalf("Sweep of a veth not ours = %d, %v; want nothing removed", n, err)
	}
	if ks := readShaping(t, h, id, host); !ks.ingress || ks.vethTbf == nil {
		t.Fatalf("Sweep removed the qdiscs of a veth not ours: %+v", ks)
	}
	if n, err := s.Sweep(ctx, nil, map[string]bool{host: true}); err != nil || n != 3 {
		t.Fatalf("Sweep = %d, %v; want 3 removed (ifb device, tbf, ingress qdisc)", n, err)
	}
	if ks := readShaping(t, h, id, host); ks.ifb != nil || ks.ingress || ks.vethTbf != nil {
		t.Fatalf("after Sweep: %+v", ks)
	}

	// The longest bucket Resolve lets through (MaxBucketTime at the
	// lowest rate) is held by the kernel as it is, not wrapped around.
	longest := Limits{EgressRate: MinRate, EgressBurst: uint64(MaxBucketTime.Seconds() * MinRate / 8)}
	if _, err := Resolve(map[string]string{LabelPrefix + Egress: FormatRate(longest.EgressRate), LabelPrefix + EgressBurst: FormatSize(longest.EgressBurst)}, nil, nil); err != nil {
		t.Fatalf("the longest bucket is refused: %v", err)
	}
	if _, err := s.Apply(ctx, id, host, longest); err != nil {
		t.Fatal(err)
	}
	ks = readShaping(t, h, id, host)
	if ks.ifbTbf == nil {
		t.Fatal("no tbf on the ifb device")
	}
	if got := netlink.Xmitsize(ks.ifbTbf.Rate, ks.ifbTbf.Buffer); got < uint32(longest.EgressBurst)*99/100 || got > uint32(longest.EgressBurst) {
		t.Fatalf("the kernel's bucket holds %d bytes, want %d (tbf %+v)", got, longest.EgressBurst, ks.ifbTbf)
	}

	if _, err := s.Apply(ctx, id, "cali00000000000", l); err == nil {
		t.Fatal("Apply to a missing veth succeeded")
	}
}

// BenchmarkShaperApplyFresh is the shaping Join adds: both directions on a
// veth that has none yet (its ifb device created). Remove is not timed.
func BenchmarkShaperApplyFresh(b *testing.B) {
	h, id, host := newTestNetns(b)
	s := NewShaper(h)
	ctx := context.Background()
	l := Limits{IngressRate: 50_000_000, EgressRate: 20_000_000}
	for b.Loop() {
		if _, err := s.Apply(ctx, id, host, l); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Remove(ctx, id, host); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
