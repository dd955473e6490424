package plugin

import (
	"net/url"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/policy"
)

// withOwnPorts is fs plus the TCP ports this daemon itself talks on with
// the rest of the cluster when they are not Calico's defaults: its BGP
// port both ways, its embedded etcd member's client and peer ports
// inbound (and the peer port outbound: the other members listen on theirs,
// by the same configuration), and the ports of the etcd endpoints it
// dials outbound. Without them a host endpoint policy, or a "*" host
// endpoint with none, would cut the host off its cluster on a
// non-default port. An empty failsafe list ("none") stays empty: the user
// asked for no failsafe ports.
func withOwnPorts(fs policy.Failsafe, cfg Config) policy.Failsafe {
	add := func(list []policy.FailsafePort, port int) []policy.FailsafePort {
		if len(list) == 0 || port < 1 || port > 65535 {
			return list
		}
		p := policy.FailsafePort{Proto: unix.IPPROTO_TCP, Port: uint16(port)}
		if slices.Contains(list, p) {
			return list
		}
		return append(list, p)
	}
	out := policy.Failsafe{Inbound: slices.Clone(fs.Inbound), Outbound: slices.Clone(fs.Outbound)}
	if cfg.BGP.Enabled {
		out.Inbound = add(out.Inbound, cfg.BGP.Port)
		out.Outbound = add(out.Outbound, cfg.BGP.Port)
	}
	if cfg.Datastore.Embedded {
		out.Inbound = add(out.Inbound, urlPort(cfg.Datastore.EmbeddedClientURL))
		out.Inbound = add(out.Inbound, urlPort(cfg.Datastore.EmbeddedPeerURL))
		out.Outbound = add(out.Outbound, urlPort(cfg.Datastore.EmbeddedPeerURL))
	}
	for _, e := range cfg.Datastore.Endpoints {
		out.Outbound = add(out.Outbound, urlPort(e))
	}
	return out
}

// urlPort is the TCP port of an http(s) URL; 0 for a unix socket or
// anything else.
func urlPort(raw string) int {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return 0
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0
	}
	return p
}
