package ipam

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/big"
	"net"
	"net/netip"
	"strings"
)

// Internally everything is netip (comparable, usable as map keys, no
// 4-vs-16-byte ambiguity); the public API speaks net.IP / net.IPNet because
// that is what the driver gets from Docker.

// prefixFromIPNet converts and canonicalises (masks) a net.IPNet.
func prefixFromIPNet(n *net.IPNet) (netip.Prefix, error) {
	if n == nil {
		return netip.Prefix{}, fmt.Errorf("%w: empty subnet", ErrInvalidCIDR)
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w: %q is not an IP network", ErrInvalidCIDR, n.String())
	}
	addr = addr.Unmap()
	ones, bits := n.Mask.Size()
	if bits == 0 || (addr.Is4() && bits != 32 && bits != 128) {
		return netip.Prefix{}, fmt.Errorf("%w: %q has a non-canonical mask", ErrInvalidCIDR, n.String())
	}
	if addr.Is4() && bits == 128 {
		ones -= 96
		if ones < 0 {
			return netip.Prefix{}, fmt.Errorf("%w: %q has a non-canonical mask", ErrInvalidCIDR, n.String())
		}
	}
	return netip.PrefixFrom(addr, ones).Masked(), nil
}

// addrFromIP converts a net.IP, unmapping IPv4-in-IPv6 so that the 16-byte
// form Go often produces for IPv4 is treated as IPv4.
func addrFromIP(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// hostNet is the single-address network handed to Docker (/32 or /128): all
// traffic then goes via the 169.254.1.1 gateway, i.e. through the host.
func hostNet(a netip.Addr) net.IPNet {
	if a.Is4() {
		b := a.As4()
		return net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(32, 32)}
	}
	b := a.As16()
	return net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(128, 128)}
}

func toIPNet(p netip.Prefix) net.IPNet {
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		return net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(p.Bits(), 32)}
	}
	b := a.As16()
	return net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(p.Bits(), 128)}
}

func toIP(a netip.Addr) net.IP {
	if a.Is4() {
		b := a.As4()
		return net.IP(b[:])
	}
	b := a.As16()
	return net.IP(b[:])
}

// blockOf is the block of the given size containing a.
func blockOf(a netip.Addr, blockBits int) netip.Prefix {
	return netip.PrefixFrom(a, blockBits).Masked()
}

// blockAddrCount is the number of addresses in a block. Block sizes are
// validated to at most 4096 addresses (/20, /116), so an int is plenty.
func blockAddrCount(p netip.Prefix) int {
	return 1 << (p.Addr().BitLen() - p.Bits())
}

// nthAddr is the ordinal-th address of an aligned block. Blocks hold at most
// 2^12 addresses, so only the low 32 bits change.
func nthAddr(p netip.Prefix, ordinal int) netip.Addr {
	b := p.Addr().As16()
	low := binary.BigEndian.Uint32(b[12:]) + uint32(ordinal)
	binary.BigEndian.PutUint32(b[12:], low)
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

// ordinalOf is the position of a inside block p, or false when outside.
func ordinalOf(p netip.Prefix, a netip.Addr) (int, bool) {
	if !p.Contains(a) {
		return 0, false
	}
	x, y := a.As16(), p.Addr().As16()
	return int(binary.BigEndian.Uint32(x[12:]) - binary.BigEndian.Uint32(y[12:])), true
}

// escapeCIDR turns a CIDR into one key segment: 192.168.0.0/26 -> 192.168.0.0-26.
func escapeCIDR(p netip.Prefix) string {
	return strings.ReplaceAll(p.String(), "/", "-")
}

// unescapeCIDR reverses escapeCIDR. Addresses never contain "-", so the last
// one is the separator.
func unescapeCIDR(s string) (netip.Prefix, bool) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(s[:i] + "/" + s[i+1:])
	if err != nil {
		return netip.Prefix{}, false
	}
	return p, true
}

// blockWalk yields the blocks of span (blockBits each) starting at an index
// derived from the host name and wrapping around, each exactly once. Like
// Calico, the start is a hash of the host so that hosts claiming at the same
// time usually look at different blocks (fewer lost races) and a host tends
// to get the same region of the pool back; within that order, blocks are
// consecutive so a host's blocks often aggregate.
func blockWalk(span netip.Prefix, blockBits int, host string) func() (netip.Prefix, bool) {
	if blockBits < span.Bits() {
		// span is smaller than a block: the one block containing it.
		done := false
		return func() (netip.Prefix, bool) {
			if done {
				return netip.Prefix{}, false
			}
			done = true
			return blockOf(span.Addr(), blockBits), true
		}
	}
	bitLen := span.Addr().BitLen()
	numBlocks := new(big.Int).Lsh(big.NewInt(1), uint(blockBits-span.Bits()))
	step := new(big.Int).Lsh(big.NewInt(1), uint(bitLen-blockBits))
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	idx := new(big.Int).Mod(big.NewInt(int64(h.Sum32())), numBlocks)
	base := new(big.Int).SetBytes(span.Addr().AsSlice())
	returned := new(big.Int)
	one := big.NewInt(1)
	return func() (netip.Prefix, bool) {
		if returned.Cmp(numBlocks) >= 0 {
			return netip.Prefix{}, false
		}
		returned.Add(returned, one)
		off := new(big.Int).Mul(idx, step)
		off.Add(off, base)
		buf := make([]byte, bitLen/8)
		off.FillBytes(buf)
		a, _ := netip.AddrFromSlice(buf)
		idx.Add(idx, one)
		if idx.Cmp(numBlocks) >= 0 {
			idx.SetInt64(0)
		}
		return netip.PrefixFrom(a, blockBits), true
	}
}

// blockCount is the number of blocks of blockBits in p, as text (IPv6 pools
// hold more blocks than an int64 counts).
func blockCount(p netip.Prefix, blockBits int) string {
	if blockBits < p.Bits() {
		return "1"
	}
	return new(big.Int).Lsh(big.NewInt(1), uint(blockBits-p.Bits())).String()
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
