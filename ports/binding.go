// Package ports publishes container ports on the host (docker run -p, -P)
// for the calico driver, which Docker does not do for a remote driver: its
// port mapper belongs to its bridge driver. The driver hands the bindings
// Docker passes to ProgramExternalConnectivity to a Manager, which
// resolves host ports (ranges, -P), refuses a port another container of the
// host publishes already, records the bindings on the endpoint record and
// programs DNAT rules in nftables tables of its own ("ip calico-cnm-ports",
// "ip6 calico-cnm-ports"), rebuilt from the datastore at start and on every
// resync.
package ports

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Docker's keys in ProgramExternalConnectivity's options (libnetwork
// netlabel.PortMap and netlabel.ExposedPorts).
const (
	OptPortMap      = "com.docker.network.portmap"
	OptExposedPorts = "com.docker.network.endpoint.exposedports"
)

// Protocol names as recorded.
const (
	TCP = "tcp"
	UDP = "udp"
)

// Ephemeral host ports for -P and `-p PORT`, as Docker's port allocator
// uses them (portallocator's defaults).
const (
	EphemeralFirst = 49153
	EphemeralLast  = 65535
)

// ErrPortInUse: the host port is published by another container of this
// host already.
var ErrPortInUse = errors.New("host port already published")

// ErrInvalid: a binding Docker sent cannot be published.
var ErrInvalid = errors.New("invalid port binding")

// Request is one binding as Docker asks for it: HostPort 0 means any free
// ephemeral port, HostPortEnd > HostPort a range to pick one from.
type Request struct {
	Proto       string
	HostIP      string // "" = every address of the host, both families
	HostPort    int
	HostPortEnd int
	Port        int
}

// dockerBinding is libnetwork's types.PortBinding as JSON.
type dockerBinding struct {
	Proto       int    `json:"Proto"`
	IP          string `json:"IP"`
	Port        int    `json:"Port"`
	HostIP      string `json:"HostIP"`
	HostPort    int    `json:"HostPort"`
	HostPortEnd int    `json:"HostPortEnd"`
}

func protoName(n int) (string, error) {
	switch n {
	case 6:
		return TCP, nil
	case 17:
		return UDP, nil
	case 132:
		return "", fmt.Errorf("%w: SCTP ports cannot be published on calico networks (only tcp and udp)", ErrInvalid)
	}
	return "", fmt.Errorf("%w: unknown IP protocol %d", ErrInvalid, n)
}

// ParseOptions reads the port bindings out of ProgramExternalConnectivity's
// options (Docker has already turned -P and ranges into one binding per
// container port). No bindings: nil.
func ParseOptions(opts map[string]interface{}) ([]Request, error) {
	raw, ok := opts[OptPortMap]
	if !ok || raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, OptPortMap, err)
	}
	var in []dockerBinding
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("%w: %s is not a list of port bindings: %v", ErrInvalid, OptPortMap, err)
	}
	var out []Request
	for _, d := range in {
		proto, err := protoName(d.Proto)
		if err != nil {
			return nil, err
		}
		r := Request{Proto: proto, HostPort: d.HostPort, HostPortEnd: d.HostPortEnd, Port: d.Port}
		if d.HostIP != "" {
			a, err := netip.ParseAddr(d.HostIP)
			if err != nil {
				return nil, fmt.Errorf("%w: host address %q", ErrInvalid, d.HostIP)
			}
			r.HostIP = a.Unmap().String()
		}
		if r.Port < 1 || r.Port > 65535 || r.HostPort < 0 || r.HostPort > 65535 || r.HostPortEnd > 65535 {
			return nil, fmt.Errorf("%w: %s port %d -> %d", ErrInvalid, proto, r.HostPort, r.Port)
		}
		if r.HostPortEnd < r.HostPort {
			r.HostPortEnd = r.HostPort
		}
		out = append(out, r)
	}
	return out, nil
}

// String is the binding as `docker port` shows one: "8080/tcp -> 0.0.0.0:18080".
func String(b datastore.PortBinding) string {
	ip := b.HostIP
	if ip == "" {
		ip = "0.0.0.0"
	}
	return fmt.Sprintf("%d/%s -> %s", b.Port, b.Proto, net.JoinHostPort(ip, fmt.Sprint(b.HostPort)))
}

// Summary is an endpoint's bindings, comma-separated ("" without any).
func Summary(bs []datastore.PortBinding) string {
	s := make([]string, 0, len(bs))
	for _, b := range bs {
		s = append(s, String(b))
	}
	return strings.Join(s, ", ")
}

// overlap: two host addresses share a socket space ("" and the
// unspecified addresses cover their families).
func overlap(a, b string) bool {
	if a == "" || b == "" || a == b {
		return true
	}
	pa, errA := netip.ParseAddr(a)
	pb, errB := netip.ParseAddr(b)
	if errA != nil || errB != nil {
		return false
	}
	if pa.Is4() != pb.Is4() {
		return false
	}
	return pa.IsUnspecified() || pb.IsUnspecified()
}

// Resolve turns requests into bindings with concrete host ports, given
// the bindings of the host's other endpoints. A fixed host port in use is
// ErrPortInUse naming the container that holds it (owner maps a binding's
// index in taken to a description); a range or an ephemeral request takes
// the lowest free port.
func Resolve(reqs []Request, taken []datastore.PortBinding, owner func(i int) string) ([]datastore.PortBinding, error) {
	used := append([]datastore.PortBinding(nil), taken...)
	busy := func(proto, hostIP string, port int) int {
		for i, t := range used {
			if t.Proto == proto && t.HostPort == port && overlap(t.HostIP, hostIP) {
				return i
			}
		}
		return -1
	}
	var out []datastore.PortBinding
	for _, r := range reqs {
		first, last := r.HostPort, r.HostPortEnd
		if first == 0 {
			first, last = EphemeralFirst, EphemeralLast
		}
		port := 0
		holder := -1
		for p := first; p <= last; p++ {
			if h := busy(r.Proto, r.HostIP, p); h >= 0 {
				if holder < 0 {
					holder = h
				}
				continue
			}
			port = p
			break
		}
		if port == 0 {
			addr := r.HostIP
			if addr == "" {
				addr = "0.0.0.0"
			}
			span := fmt.Sprint(first)
			if last != first {
				span = fmt.Sprintf("%d-%d", first, last)
			}
			who := "another binding of the same container"
			if holder < len(taken) && owner != nil {
				who = owner(holder)
			}
			return nil, fmt.Errorf("%w: cannot publish %s port %s on %s: it is published by %s", ErrPortInUse, r.Proto, span, addr, who)
		}
		b := datastore.PortBinding{Proto: r.Proto, HostIP: r.HostIP, HostPort: port, Port: r.Port}
		used = append(used, b)
		out = append(out, b)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Proto != out[j].Proto {
			return out[i].Proto < out[j].Proto
		}
		return out[i].HostPort < out[j].HostPort
	})
	return out, nil
}

// OptInternal is libnetwork's option for `docker network create
// --internal` (netlabel.Internal), as the driver records it.
const OptInternal = "com.docker.network.internal"
