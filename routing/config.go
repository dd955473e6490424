// Package routing makes the host a router: an in-process BGP speaker that
// advertises this host's blocks and installs its peers' blocks into the
// kernel.
//
// The package is split so that the decisions are pure and unit-tested:
//
//   - policy.go: which peers (mesh, route reflectors, explicit peers), which
//     prefixes to export, which learned paths to accept, ECMP selection;
//   - routes.go: the diff between desired and kernel routes, and the netlink
//     table that applies it;
//   - speaker.go: the narrow Speaker interface and its gobgp implementation;
//   - agent.go: the loop that follows the datastore, the IPAM blocks and the
//     speaker, and reconciles.
package routing

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// Defaults, as documented in the README.
const (
	DefaultASN         uint32 = 64512
	DefaultPort               = 179
	DefaultRestartTime        = 120 * time.Second
	DefaultSyncTimeout        = 60 * time.Second
	// StatusSocketName is created in the daemon's state dir; `calico-cnm
	// node status` reads it.
	StatusSocketName = "bgp.sock"
)

// LearnedProtocol marks the kernel routes this package installs for
// prefixes learned over BGP ("proto 81" in `ip route`). It is deliberately
// not dataplane.RouteProtocol (80): the blackholes of our own blocks and the
// /32 routes of local workloads carry 80, and the stale-route cleanup here
// deletes by protocol, so a separate number makes it impossible for routing
// to remove a route it does not own. 81 is unassigned in rtnetlink.h and
// iproute2's rt_protos (bird is 12, zebra 11, bgp 186).
const LearnedProtocol netlink.RouteProtocol = 81

// Config is the daemon's BGP configuration (flags and env of `serve`).
type Config struct {
	// Enabled turns the BGP speaker on. Off, the host still routes its own
	// containers but shares no routes with other hosts.
	Enabled bool
	// NodeIP is this node's BGP address (IPv4). Empty: autodetect with
	// AutodetectMethod.
	NodeIP string
	// NodeIPv6 is the next hop this node gives its IPv6 prefixes: "" finds
	// the first global IPv6 address of the interface holding the IPv4 node
	// address; "none" routes no IPv6.
	NodeIPv6 string
	// AutodetectMethod: "" or "first-found" (the address of the interface
	// holding the default route), "interface=REGEX" (the first address of
	// the first interface whose name matches), "can-reach=ADDR" (the source
	// address the kernel picks towards ADDR).
	AutodetectMethod string
	// ASN overrides this node's AS number; 0 keeps the node record's value,
	// else the cluster default (`bgp config --asn`, default 64512).
	ASN uint32
	// ListenAddress is where the speaker accepts sessions ("" = all).
	ListenAddress string
	// Port is the BGP port, for listening and connecting (default 179).
	Port int
	// RestartTime is the graceful-restart time advertised to peers: how long
	// they keep our routes while we restart.
	RestartTime time.Duration
	// SyncTimeout bounds how long after a start learned kernel routes that
	// are not (yet) in the RIB are kept: until every peer has sent its
	// End-of-RIB, or this much time has passed.
	SyncTimeout time.Duration
	// StatusSocket is the unix socket serving `node status` ("" = none).
	StatusSocket string
	// SecretsDir holds the files BGP peer records name as PasswordSecret
	// (default DefaultSecretsDir).
	SecretsDir string
}

// NoIPv6 as Config.NodeIPv6 turns IPv6 routing off.
const NoIPv6 = "none"

// DefaultSecretsDir is where a node looks for BGP password secrets.
const DefaultSecretsDir = "/etc/calico-cnm/bgp-secrets"

// Finish applies defaults and validates; errors are one sentence.
func (c *Config) Finish() error {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("BGP port %d: use 1-65535", c.Port)
	}
	if c.RestartTime <= 0 {
		c.RestartTime = DefaultRestartTime
	}
	if c.RestartTime > 4095*time.Second {
		return fmt.Errorf("BGP restart time %s: the protocol allows at most 4095s", c.RestartTime)
	}
	if c.SyncTimeout <= 0 {
		c.SyncTimeout = DefaultSyncTimeout
	}
	if c.NodeIP != "" {
		a, err := netip.ParseAddr(c.NodeIP)
		if err != nil || !a.Is4() {
			return fmt.Errorf("BGP node address %q is not an IPv4 address", c.NodeIP)
		}
	}
	if c.NodeIPv6 != "" && c.NodeIPv6 != NoIPv6 {
		a, err := netip.ParseAddr(c.NodeIPv6)
		if err != nil || !a.Is6() || a.Is4In6() || a.IsLinkLocalUnicast() || a.IsLoopback() {
			return fmt.Errorf("BGP IPv6 next hop %q is not a global IPv6 address (or %q)", c.NodeIPv6, NoIPv6)
		}
	}
	if c.ListenAddress != "" {
		if _, err := netip.ParseAddr(c.ListenAddress); err != nil {
			return fmt.Errorf("BGP listen address %q is not an IP address", c.ListenAddress)
		}
	}
	if _, err := ParseAutodetect(c.AutodetectMethod); err != nil {
		return err
	}
	return nil
}

// Autodetect is a parsed IP_AUTODETECTION_METHOD.
type Autodetect struct {
	Interface *regexp.Regexp // interface=REGEX
	CanReach  netip.Addr     // can-reach=ADDR
}

// ParseAutodetect parses "", "first-found", "interface=REGEX" or
// "can-reach=ADDR".
func ParseAutodetect(s string) (Autodetect, error) {
	switch {
	case s == "" || s == "first-found":
		return Autodetect{}, nil
	case strings.HasPrefix(s, "interface="):
		re, err := regexp.Compile("^(?:" + strings.TrimPrefix(s, "interface=") + ")$")
		if err != nil {
			return Autodetect{}, fmt.Errorf("address autodetection %q: bad interface regexp: %v", s, err)
		}
		return Autodetect{Interface: re}, nil
	case strings.HasPrefix(s, "can-reach="):
		a, err := netip.ParseAddr(strings.TrimPrefix(s, "can-reach="))
		if err != nil || !a.Is4() {
			return Autodetect{}, fmt.Errorf("address autodetection %q: can-reach needs an IPv4 address", s)
		}
		return Autodetect{CanReach: a}, nil
	}
	return Autodetect{}, fmt.Errorf("address autodetection %q: use first-found, interface=REGEX or can-reach=ADDR", s)
}
