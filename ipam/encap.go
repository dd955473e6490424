package ipam

import (
	"context"
	"net/netip"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Encapsulation modes of a pool (Calico's vxlanMode and ipipMode values).
const (
	// EncapNever: hosts route the pool's addresses directly (BGP, or one
	// L2 segment).
	EncapNever = "Never"
	// EncapAlways: traffic to the pool's addresses on another host is
	// always encapsulated.
	EncapAlways = "Always"
	// EncapCrossSubnet: encapsulated only towards hosts outside this
	// host's subnet; hosts in the same subnet are reached directly.
	EncapCrossSubnet = "CrossSubnet"
)

// EncapModes lists the accepted vxlanMode values, for help texts.
var EncapModes = []string{EncapNever, EncapAlways, EncapCrossSubnet}

// ParseEncapMode canonicalises a mode name ("" and any case accepted).
func ParseEncapMode(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return EncapNever, true
	}
	for _, m := range EncapModes {
		if strings.EqualFold(s, m) {
			return m, true
		}
	}
	return "", false
}

// VXLAN is the pool's effective vxlanMode (EncapNever when unset).
func (p Pool) VXLAN() string {
	if m, ok := ParseEncapMode(p.VXLANMode); ok {
		return m
	}
	return EncapNever
}

// Encapsulates: traffic to this pool may leave a host encapsulated, so its
// workloads need room for the encapsulation header in their MTU.
func (p Pool) Encapsulates() bool { return p.VXLAN() != EncapNever }

// validateEncap canonicalises and checks the encapsulation modes of p.
func validateEncap(p *Pool, pfx netip.Prefix) error {
	m, ok := ParseEncapMode(p.VXLANMode)
	if !ok {
		return newError(ErrInvalidArgument, "pool %s: unknown vxlanMode %q (use %s)", pfx, p.VXLANMode, strings.Join(EncapModes, ", "))
	}
	if m != EncapNever && pfx.Addr().Is6() {
		return newError(ErrInvalidArgument, "pool %s: VXLAN is supported for IPv4 pools only; leave vxlanMode Never on IPv6 pools", pfx)
	}
	p.VXLANMode = m
	if p.VXLANMode == EncapNever {
		p.VXLANMode = "" // the stored default, as older records have it
	}
	// IP-in-IP would need the kernel's ipip module and a data path this
	// project does not have: accepting the setting would silently route
	// nothing, so anything but Never is refused.
	switch ipip, _ := ParseEncapMode(p.IPIPMode); ipip {
	case EncapNever:
		p.IPIPMode = ""
	default:
		return newError(ErrInvalidArgument, "pool %s: ipipMode %q is not supported (calico-cnm has no IP-in-IP data path); use Never, and --vxlan-mode Always or CrossSubnet for encapsulation", pfx, p.IPIPMode)
	}
	return nil
}

// SetPoolVXLANMode changes the vxlanMode of a live pool. Every daemon
// follows the pool record and adds or removes its VXLAN routes.
func (e *Engine) SetPoolVXLANMode(ctx context.Context, cidr, mode string) (Pool, error) {
	var out Pool
	err := e.store.Retry(ctx, func(ctx context.Context) error {
		p, err := e.getPool(ctx, cidr)
		if err != nil {
			return err
		}
		next := p.Pool
		next.VXLANMode = mode
		if err := validateEncap(&next, p.prefix); err != nil {
			return err
		}
		out = next
		if next == p.Pool {
			return nil
		}
		return e.store.Txn(ctx, datastore.Update(poolKey(p.prefix), datastore.MustJSON(next), p.rev))
	})
	e.invalidatePools()
	if err != nil {
		return Pool{}, err
	}
	e.log.WithFields(logrus.Fields{"pool": out.CIDR, "vxlanMode": out.VXLAN()}).Info("IP pool updated")
	return out, nil
}

// VXLANTunnelHandlePrefix starts the handle of every node's VTEP address
// (Calico's name), so the address is found, audited and released by node.
const VXLANTunnelHandlePrefix = "vxlan-tunnel-addr-"

// VXLANTunnelHandle is the IPAM handle of node's VTEP address.
func VXLANTunnelHandle(node string) string { return VXLANTunnelHandlePrefix + node }

// WireGuardTunnelHandlePrefix starts the handle of every node's address
// on wireguard.cali (Calico's name): like a VTEP address, it belongs to
// its node, not to a workload.
const WireGuardTunnelHandlePrefix = "wireguard-tunnel-addr-"

// WireGuardTunnelHandle is the IPAM handle of node's WireGuard address.
func WireGuardTunnelHandle(node string) string { return WireGuardTunnelHandlePrefix + node }

// TunnelHandleNode returns the node whose tunnel address (VTEP or
// WireGuard) the handle holds.
func TunnelHandleNode(handle string) (string, bool) {
	for _, prefix := range []string{VXLANTunnelHandlePrefix, WireGuardTunnelHandlePrefix} {
		if n, ok := strings.CutPrefix(handle, prefix); ok && n != "" {
			return n, true
		}
	}
	return "", false
}
