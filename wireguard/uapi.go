package wireguard

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The cross-platform userspace API (wireguard.com/xplatform): the text
// wireguard-go reads in IpcSet and writes in IpcGet. wgtypes.Config is
// encoded here the way wgctrl encodes it for a userspace socket, so that
// one configuration drives either implementation.

func encodeUAPI(cfg wgtypes.Config) string {
	var b strings.Builder
	kv := func(k, v string) { fmt.Fprintf(&b, "%s=%s\n", k, v) }
	if cfg.PrivateKey != nil {
		kv("private_key", hex.EncodeToString(cfg.PrivateKey[:]))
	}
	if cfg.ListenPort != nil {
		kv("listen_port", strconv.Itoa(*cfg.ListenPort))
	}
	if cfg.FirewallMark != nil {
		kv("fwmark", strconv.Itoa(*cfg.FirewallMark))
	}
	if cfg.ReplacePeers {
		kv("replace_peers", "true")
	}
	for _, p := range cfg.Peers {
		kv("public_key", hex.EncodeToString(p.PublicKey[:]))
		if p.Remove {
			kv("remove", "true")
			continue
		}
		if p.UpdateOnly {
			kv("update_only", "true")
		}
		if p.PresharedKey != nil {
			kv("preshared_key", hex.EncodeToString(p.PresharedKey[:]))
		}
		if p.Endpoint != nil {
			kv("endpoint", p.Endpoint.String())
		}
		if p.PersistentKeepaliveInterval != nil {
			kv("persistent_keepalive_interval", strconv.Itoa(int(p.PersistentKeepaliveInterval.Seconds())))
		}
		if p.ReplaceAllowedIPs {
			kv("replace_allowed_ips", "true")
		}
		for _, n := range p.AllowedIPs {
			kv("allowed_ip", n.String())
		}
	}
	return b.String()
}

// decodeUAPI reads the answer to a get operation.
func decodeUAPI(s string) (DeviceState, error) {
	var st DeviceState
	var peer *PeerState
	var hsSec, hsNsec int64
	flush := func() {
		if peer == nil {
			return
		}
		if hsSec != 0 || hsNsec != 0 {
			peer.LastHandshake = time.Unix(hsSec, hsNsec)
		}
		st.Peers = append(st.Peers, *peer)
		peer, hsSec, hsNsec = nil, 0, 0
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "private_key":
			var key wgtypes.Key
			if key, err = hexKey(v); err == nil {
				st.PublicKey = key.PublicKey()
			}
		case "listen_port":
			st.ListenPort, err = strconv.Atoi(v)
		case "public_key":
			flush()
			var key wgtypes.Key
			key, err = hexKey(v)
			peer = &PeerState{PublicKey: key}
		}
		if peer != nil && err == nil {
			switch k {
			case "endpoint":
				peer.Endpoint, err = netip.ParseAddrPort(v)
			case "allowed_ip":
				var p netip.Prefix
				if p, err = netip.ParsePrefix(v); err == nil {
					peer.AllowedIPs = append(peer.AllowedIPs, p)
				}
			case "last_handshake_time_sec":
				hsSec, err = strconv.ParseInt(v, 10, 64)
			case "last_handshake_time_nsec":
				hsNsec, err = strconv.ParseInt(v, 10, 64)
			case "rx_bytes":
				peer.RxBytes, err = strconv.ParseInt(v, 10, 64)
			case "tx_bytes":
				peer.TxBytes, err = strconv.ParseInt(v, 10, 64)
			}
		}
		if err != nil {
			return DeviceState{}, fmt.Errorf("reading the state of %s: %s: %w", Device, k, err)
		}
	}
	flush()
	return st, nil
}

func hexKey(s string) (wgtypes.Key, error) {
	b, err := hex.DecodeString(s)
	if err != nil {
		return wgtypes.Key{}, err
	}
	return wgtypes.NewKey(b)
}

// prefixOf converts a net.IPNet's parts.
func prefixOf(ip net.IP, mask net.IPMask) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
