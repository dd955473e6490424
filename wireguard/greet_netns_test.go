package wireguard

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"
	"github.com/vishvananda/netns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/internal/netnstest"
	"github.com/calico-cnm/calico-cnm/internal/nsthread"
)

// inNamespace runs fn on a thread inside the namespace called name, so
// that the TUN and the UDP sockets fn makes belong to it.
func inNamespace(t *testing.T, name string, fn func() error) {
	t.Helper()
	target, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := nsthread.Do(target, fn); err != nil {
		t.Fatal(err)
	}
}

// wgHost is one end: a namespace and its userspace wireguard.cali.
type wgHost struct {
	ns   string
	addr string // on the veth
	key  wgtypes.Key
	link Link
}

// open makes h's device (again) and gives it its key, its port and peer.
func (h *wgHost) open(t *testing.T, peer *wgHost) {
	t.Helper()
	log, _ := test.NewNullLogger()
	port := DefaultPort
	inNamespace(t, h.ns, func() error {
		l, err := openUserspace(1420, log, nil)
		if err != nil {
			return err
		}
		// Detach, not Close: Close deletes wireguard.cali in the namespace
		// of the calling thread, the test's. The namespace takes the TUN
		// with it.
		t.Cleanup(func() { _ = l.Detach() })
		h.link = l
		return l.Configure(wgtypes.Config{PrivateKey: &h.key, ListenPort: &port, Peers: []wgtypes.PeerConfig{{
			PublicKey:  peer.key.PublicKey(),
			Endpoint:   &net.UDPAddr{IP: net.ParseIP(peer.addr), Port: DefaultPort},
			AllowedIPs: []net.IPNet{{IP: net.ParseIP("10.78.0.0").To4(), Mask: net.CIDRMask(26, 32)}},
		}}})
	})
}

// lastHandshake is when h's device last completed a handshake with peer.
func (h *wgHost) lastHandshake(t *testing.T, peer *wgHost) time.Time {
	t.Helper()
	st, err := h.link.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Peers {
		if p.PublicKey == peer.key.PublicKey() {
			return p.LastHandshake
		}
	}
	t.Fatalf("%s's device has no peer %s: %+v", h.ns, peer.key.PublicKey(), st)
	return time.Time{}
}

// waitHandshakeAfter waits until h saw a handshake with peer after since.
func waitHandshakeAfter(t *testing.T, h, peer *wgHost, since time.Time, what string) {
	t.Helper()
	// Well under the 15 s after which an unanswered WireGuard peer starts
	// a handshake of its own: the greeting made this one.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if hs := h.lastHandshake(t, peer); hs.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no handshake within 5 s (last %v)", what, h.lastHandshake(t, peer))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUserspaceGreetHandshakes: two userspace devices in two namespaces
// joined by a veth, each the other's peer, and not one packet routed to
// either. A's greeting makes a handshake that b's device records; after
// a's device is made again, as a restarted daemon makes it, with no
// session, its greeting makes a new one at once, instead of b waiting the
// 15 s its WireGuard gives an unanswered session.
func TestUserspaceGreetHandshakes(t *testing.T) {
	a := &wgHost{ns: netnstest.NewNamed(t, "wggreet", "greeting WireGuard peers"), addr: "10.77.0.1", key: mustKey(t)}
	b := &wgHost{ns: netnstest.NewNamed(t, "wggreet", "greeting WireGuard peers"), addr: "10.77.0.2", key: mustKey(t)}
	for _, args := range [][]string{
		{"-n", a.ns, "link", "add", "wgg0", "type", "veth", "peer", "name", "wgg1", "netns", b.ns},
		{"-n", a.ns, "addr", "add", a.addr + "/24", "dev", "wgg0"},
		{"-n", b.ns, "addr", "add", b.addr + "/24", "dev", "wgg1"},
		{"-n", a.ns, "link", "set", "wgg0", "up"},
		{"-n", b.ns, "link", "set", "wgg1", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	a.open(t, b)
	b.open(t, a)

	if hs := b.lastHandshake(t, a); !hs.IsZero() {
		t.Fatalf("a handshake before any greeting or packet: %v", hs)
	}
	if err := a.link.Greet([]wgtypes.Key{b.key.PublicKey()}); err != nil {
		t.Fatal(err)
	}
	waitHandshakeAfter(t, b, a, time.Time{}, "a greeted b")

	// a's daemon restarts: its device goes and comes back without sessions.
	first := b.lastHandshake(t, a)
	if err := a.link.Detach(); err != nil {
		t.Fatal(err)
	}
	a.open(t, b)
	if err := a.link.Greet([]wgtypes.Key{b.key.PublicKey()}); err != nil {
		t.Fatal(err)
	}
	waitHandshakeAfter(t, b, a, first, "a's device made again greeted b")

	if err := a.link.Greet([]wgtypes.Key{mustKey(t).PublicKey()}); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("greeting a key that is no peer: %v, want an error naming it", err)
	}
}
