package wireguard

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestUAPIAgainstWireGuardGo configures a real wireguard-go device (on a
// channel TUN; never up, so it binds no socket) with encodeUAPI and reads it back
// with decodeUAPI: peers are added, changed and removed one by one.
func TestUAPIAgainstWireGuardGo(t *testing.T) {
	dev := device.NewDevice(tuntest.NewChannelTUN().TUN(), conn.NewStdNetBind(), device.NewLogger(device.LogLevelSilent, ""))
	defer dev.Close()
	priv, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	kb, kc := mustKey(t), mustKey(t)
	port, mark := 51820, FirewallMark
	ipnet := func(s string) net.IPNet {
		_, n, _ := net.ParseCIDR(s)
		return *n
	}
	cfg := wgtypes.Config{PrivateKey: &priv, ListenPort: &port, FirewallMark: &mark, Peers: []wgtypes.PeerConfig{
		{PublicKey: kb, Endpoint: &net.UDPAddr{IP: net.IPv4(172, 16, 0, 2), Port: 51820}, ReplaceAllowedIPs: true, AllowedIPs: []net.IPNet{ipnet("10.0.1.0/26"), ipnet("10.0.9.1/32")}},
		{PublicKey: kc, Endpoint: &net.UDPAddr{IP: net.IPv4(172, 16, 1, 3), Port: 51821}, ReplaceAllowedIPs: true, AllowedIPs: []net.IPNet{ipnet("10.0.2.0/26")}},
	}}
	if err := dev.IpcSet(encodeUAPI(cfg)); err != nil {
		t.Fatal(err)
	}
	st := get(t, dev)
	if st.PublicKey != priv.PublicKey() {
		t.Errorf("public key %s, want %s", st.PublicKey, priv.PublicKey())
	}
	want := []PeerState{
		{PublicKey: kb, Endpoint: netip.MustParseAddrPort("172.16.0.2:51820"), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/26"), netip.MustParsePrefix("10.0.9.1/32")}},
		{PublicKey: kc, Endpoint: netip.MustParseAddrPort("172.16.1.3:51821"), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/26")}},
	}
	checkPeers(t, st, want)

	// Replace b's allowed IPs, remove c.
	if err := dev.IpcSet(encodeUAPI(wgtypes.Config{Peers: []wgtypes.PeerConfig{
		{PublicKey: kb, ReplaceAllowedIPs: true, AllowedIPs: []net.IPNet{ipnet("10.0.4.0/26")}},
		{PublicKey: kc, Remove: true},
	}})); err != nil {
		t.Fatal(err)
	}
	want = []PeerState{{PublicKey: kb, Endpoint: netip.MustParseAddrPort("172.16.0.2:51820"), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.4.0/26")}}}
	checkPeers(t, get(t, dev), want)
}

func get(t *testing.T, dev *device.Device) DeviceState {
	t.Helper()
	s, err := dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeUAPI(s)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func checkPeers(t *testing.T, st DeviceState, want []PeerState) {
	t.Helper()
	got := slices.Clone(st.Peers)
	slices.SortFunc(got, func(a, b PeerState) int { return a.Endpoint.Compare(b.Endpoint) })
	if !slices.EqualFunc(got, want, func(a, b PeerState) bool {
		return a.PublicKey == b.PublicKey && a.Endpoint == b.Endpoint && slices.Equal(sortedPrefixes(a.AllowedIPs), b.AllowedIPs) && a.LastHandshake.IsZero()
	}) {
		t.Errorf("peers:\n got %+v\nwant %+v", got, want)
	}
}
