package wireguard

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Implementations of the device, as `node status` names them.
const (
	ImplKernel    = "kernel"
	ImplUserspace = "userspace"
)

// PeerState is one peer as the device reports it.
type PeerState struct {
	PublicKey     wgtypes.Key
	Endpoint      netip.AddrPort
	AllowedIPs    []netip.Prefix
	LastHandshake time.Time // zero: never
	RxBytes       int64
	TxBytes       int64
}

// DeviceState is what the device reports.
type DeviceState struct {
	PublicKey  wgtypes.Key // of the private key it holds (zero: none)
	ListenPort int
	Peers      []PeerState
}

// Link is wireguard.cali, kernel or userspace: both take the same
// configuration (wgtypes.Config, never with ReplacePeers: peers are
// added, changed and removed one by one, so that sessions of unchanged
// peers survive).
type Link interface {
	Implementation() string
	Configure(cfg wgtypes.Config) error
	State() (DeviceState, error)
	// Greet starts a handshake with each of peers now, instead of at the
	// first packet routed to it. A device made by this process holds no
	// session: without a greeting, a peer that keeps sending on the
	// session it had with the daemon before (a TCP stream across a
	// restart) is not answered until its own WireGuard starts a handshake,
	// 15 s after the first of those packets went unanswered.
	Greet(peers []wgtypes.Key) error
	// Close removes the device.
	Close() error
	// Detach lets go of the device and leaves it, with its routes, for
	// the next daemon (userspace: wireguard-go's goroutines and sockets
	// end, the persistent TUN stays and drops what is routed to it).
	Detach() error
}

// InvalidHandshake is told the endpoint a handshake came from that the
// device could not verify (userspace only: the kernel does not say).
type InvalidHandshake func(from string)

// OpenLink creates wireguard.cali (or takes over a kernel one that is
// there already) with mtu, up: the kernel's where the kernel has
// WireGuard, wireguard-go's over TUN in this process otherwise.
func OpenLink(mtu int, log logrus.FieldLogger, invalid InvalidHandshake) (Link, error) {
	if l, err := openKernel(mtu); err == nil {
		return l, nil
	} else if !errors.Is(err, errNoKernelWireGuard) {
		return nil, err
	}
	return openUserspace(mtu, log, invalid)
}

var errNoKernelWireGuard = errors.New("the kernel has no WireGuard")

type kernelLink struct {
	client *wgctrl.Client
}

func openKernel(mtu int) (Link, error) {
	old, err := netlink.LinkByName(Device)
	if err == nil && old.Type() != "wireguard" {
		// The persistent TUN of the userspace device an earlier run
		// chose: this kernel has no WireGuard.
		return nil, fmt.Errorf("%w: %s is a %s", errNoKernelWireGuard, Device, old.Type())
	}
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = Device, mtu
		if err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT) || strings.Contains(err.Error(), "not supported") {
				return nil, fmt.Errorf("%w: %v", errNoKernelWireGuard, err)
			}
			return nil, fmt.Errorf("creating %s: %w", Device, err)
		}
	}
	l, err := netlink.LinkByName(Device)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", Device, err)
	}
	if err := setUp(l, mtu); err != nil {
		return nil, err
	}
	client, err := wgctrl.New()
	if err != nil {
		_ = netlink.LinkDel(l)
		return nil, fmt.Errorf("opening the WireGuard netlink family: %w", err)
	}
	return &kernelLink{client: client}, nil
}

func (k *kernelLink) Implementation() string { return ImplKernel }

func (k *kernelLink) Configure(cfg wgtypes.Config) error {
	return k.client.ConfigureDevice(Device, cfg)
}

func (k *kernelLink) State() (DeviceState, error) {
	d, err := k.client.Device(Device)
	if err != nil {
		return DeviceState{}, err
	}
	st := DeviceState{PublicKey: d.PublicKey, ListenPort: d.ListenPort}
	for _, p := range d.Peers {
		ps := PeerState{PublicKey: p.PublicKey, LastHandshake: p.LastHandshakeTime, RxBytes: p.ReceiveBytes, TxBytes: p.TransmitBytes}
		if p.Endpoint != nil {
			ps.Endpoint = p.Endpoint.AddrPort()
		}
		for _, n := range p.AllowedIPs {
			if pfx, ok := prefixOf(n.IP, n.Mask); ok {
				ps.AllowedIPs = append(ps.AllowedIPs, pfx)
			}
		}
		st.Peers = append(st.Peers, ps)
	}
	return st, nil
}

// Greet does nothing on a kernel device: it lives in the kernel and its
// sessions outlive the daemon. A kernel device deleted behind the daemon
// and made again does lose them, and is not greeted: this machine's
// kernel has no WireGuard to prove a greeting on.
func (k *kernelLink) Greet([]wgtypes.Key) error { return nil }

func (k *kernelLink) Close() error {
	_ = k.client.Close()
	return deleteLink()
}

func (k *kernelLink) Detach() error { return k.client.Close() }

// userspaceLink is wireguard-go in this process: the TUN device lives as
// long as the process (a restarted daemon makes a new one at once, with
// the same key, and the peers' sessions resume).
type userspaceLink struct {
	dev *device.Device
}

func openUserspace(mtu int, log logrus.FieldLogger, invalid InvalidHandshake) (Link, error) {
	if old, err := netlink.LinkByName(Device); err == nil && old.Type() != "tuntap" {
		if err := netlink.LinkDel(old); err != nil {
			return nil, fmt.Errorf("removing %s (%s): %w", Device, old.Type(), err)
		}
	}
	// Attaches to the TUN an earlier run left, with its routes.
	t, err := tun.CreateTUN(Device, mtu)
	if err != nil {
		return nil, fmt.Errorf("creating the TUN device %s: %w", Device, err)
	}
	if err := persist(t); err != nil {
		t.Close()
		return nil, err
	}
	dev := device.NewDevice(t, conn.NewDefaultBind(), deviceLogger(log, invalid))
	if err := dev.Up(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("starting %s: %w", Device, err)
	}
	l, err := netlink.LinkByName(Device)
	if err == nil {
		err = setUp(l, mtu)
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &userspaceLink{dev: dev}, nil
}

// persist keeps the TUN (and the routes through it) when this process
// ends: until a restarted daemon attaches, packets to it are dropped, not
// routed in clear by the main table, and connections resume after.
func persist(t tun.Device) error {
	nt, ok := t.(*tun.NativeTun)
	if !ok {
		return nil
	}
	rc, err := nt.File().SyscallConn()
	if err != nil {
		return fmt.Errorf("making %s persistent: %w", Device, err)
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, 1) }); err != nil {
		return fmt.Errorf("making %s persistent: %w", Device, err)
	}
	if ioErr != nil {
		return fmt.Errorf("making %s persistent: %w", Device, ioErr)
	}
	return nil
}

// invalidInitiation is how wireguard-go reports a handshake initiation it
// could not verify (device/receive.go).
const invalidInitiation = "Received invalid initiation message from %s"

// deviceLogger passes wireguard-go's messages on at debug level, and
// tells invalid about unverifiable handshakes.
func deviceLogger(log logrus.FieldLogger, invalid InvalidHandshake) *device.Logger {
	l := log.WithField("device", Device)
	return &device.Logger{
		Verbosef: func(format string, args ...any) {
			if format == invalidInitiation && len(args) == 1 && invalid != nil {
				invalid(fmt.Sprint(args[0]))
			}
			l.Debugf(format, args...)
		},
		Errorf: func(format string, args ...any) { l.Debugf(format, args...) },
	}
}

func (u *userspaceLink) Implementation() string { return ImplUserspace }

func (u *userspaceLink) Configure(cfg wgtypes.Config) error {
	return u.dev.IpcSet(encodeUAPI(cfg))
}

func (u *userspaceLink) State() (DeviceState, error) {
	s, err := u.dev.IpcGet()
	if err != nil {
		return DeviceState{}, err
	}
	return decodeUAPI(s)
}

// Greet sends each peer a keepalive, which, with no session, makes
// wireguard-go send a handshake initiation first.
func (u *userspaceLink) Greet(peers []wgtypes.Key) error {
	var unknown []string
	for _, k := range peers {
		p := u.dev.LookupPeer(device.NoisePublicKey(k))
		if p == nil {
			unknown = append(unknown, k.String())
			continue
		}
		p.SendKeepalive()
	}
	if len(unknown) > 0 {
		return fmt.Errorf("greeting peers of %s: not configured: %s", Device, strings.Join(unknown, ", "))
	}
	return nil
}

func (u *userspaceLink) Close() error {
	u.dev.Close()
	return deleteLink()
}

// Detach stops wireguard-go; the TUN is persistent, so closing it leaves
// the interface and its routes as a process exit does.
func (u *userspaceLink) Detach() error {
	u.dev.Close()
	return nil
}

// setUp sets the device's MTU and brings it up.
func setUp(l netlink.Link, mtu int) error {
	if l.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("setting the MTU of %s: %w", Device, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing %s up: %w", Device, err)
	}
	return nil
}

// deleteLink removes wireguard.cali if it is still there.
func deleteLink() error {
	l, err := netlink.LinkByName(Device)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("removing %s: %w", Device, err)
	}
	return nil
}
