package e2e

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

// inetSocket is one entry of /proc/<pid>/net/{tcp,tcp6,udp,udp6}.
type inetSocket struct {
	proto string
	local net.IP
	port  int
	state string // hex, "0A" = LISTEN for TCP
	inode string
}

func (s inetSocket) String() string {
	return fmt.Sprintf("%s %s state %s", s.proto, net.JoinHostPort(s.local.String(), strconv.Itoa(s.port)), s.state)
}

// procIP decodes the kernel's hex address: 32-bit words in host (little
// endian) byte order.
func procIP(h string) (net.IP, error) {
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil, fmt.Errorf("bad address %q", h)
	}
	ip := make(net.IP, len(b))
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(ip[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	return ip, nil
}

// procInetSockets reads the sockets of pid's network namespace.
func procInetSockets(t *testing.T, pid int) []inetSocket {
	t.Helper()
	var out []inetSocket
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			t.Fatalf("reading /proc/%d/net/%s: %v", pid, proto, err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 {
				continue
			}
			hostPort := strings.Split(f[1], ":")
			ip, err := procIP(hostPort[0])
			if err != nil {
				t.Fatalf("/proc/%d/net/%s: %v", pid, proto, err)
			}
			port, _ := strconv.ParseInt(hostPort[1], 16, 32)
			out = append(out, inetSocket{proto: proto, local: ip, port: int(port), state: f[3], inode: f[9]})
		}
	}
	return out
}

// socketInodes are the inodes of the sockets pid has open.
func socketInodes(t *testing.T, pid int) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	return out
}

// listeningUnixPaths are the unix sockets pid listens on (state 01 with the
// __SO_ACCEPTCON flag 00010000), by path.
func listeningUnixPaths(t *testing.T, pid int, mine map[string]bool) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 7 || !mine[f[6]] || f[3] != "00010000" {
			continue
		}
		path := "(unnamed)"
		if len(f) >= 8 {
			path = f[7]
		}
		out = append(out, path)
	}
	sort.Strings(out)
	return out
}

// TestDaemonExposure: the plugin sockets are 0660 and owned by root, and
// the daemon listens on nothing but them, its embedded etcd on loopback and
// (enabled here) the metrics listener on loopback: no other TCP listener,
// no UDP socket, no other unix listener. A non-loopback metrics address is
// refused at start. (BGP is off here: its port belongs to the routing tests.)
func TestDaemonExposure(t *testing.T) {
	t.Parallel()
	const metrics = "127.0.0.1:9091"
	// The BGP speaker runs too, bound to the host's fabric address: the one
	// listener that may face the network.
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	host := harness.NewFabric(t, "").AddHost(t, "exposure", harness.HostOptions{})
	bgpAddr := host.IP.String()
	p := host.StartPlugin(t, bin, nil, append(host.ServeArgs(nil), "--metrics-listen", metrics, "--bgp", "--bgp-listen-address", bgpAddr)...)
	h := &calicoHost{Host: host, bin: bin, plugin: p}
	t.Cleanup(func() {
		if t.Failed() {
			host.DumpLogs(t, 120)
		}
	})
	pid := h.plugin.Pid()
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || filepath.Base(exe) != filepath.Base(h.bin) {
		t.Fatalf("pid %d is %q (%v), not the daemon", pid, exe, err)
	}
	// Let the daemon finish starting (the metrics listener comes up after
	// the datastore) before looking.
	harness.Eventually(t, 20*time.Second, 200*time.Millisecond, "metrics listener up", func() error {
		mine := socketInodes(t, pid)
		for _, s := range procInetSockets(t, pid) {
			if mine[s.inode] && s.port == 9091 && s.state == "0A" {
				return nil
			}
		}
		return fmt.Errorf("the daemon does not listen on %s yet", metrics)
	})
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "BGP listener up", func() error {
		mine := socketInodes(t, pid)
		for _, s := range procInetSockets(t, pid) {
			if mine[s.inode] && s.port == 179 && s.state == "0A" {
				return nil
			}
		}
		return fmt.Errorf("the daemon does not listen on %s:179 yet", bgpAddr)
	})

	t.Run("sockets are 0660 root:root", func(t *testing.T) {
		for _, s := range []string{harness.NetworkSocket, harness.IpamSocket} {
			path := filepath.Join(h.PluginDir, s)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Type() != os.ModeSocket {
				t.Errorf("%s is not a socket (%v)", path, fi.Mode())
			}
			if perm := fi.Mode().Perm(); perm != 0o660 {
				t.Errorf("%s has mode %o, want 660", path, perm)
			}
			if st.Uid != 0 || st.Gid != 0 {
				t.Errorf("%s is owned by %d:%d, want root (0:0)", path, st.Uid, st.Gid)
			}
		}
	})

	t.Run("listens only where it should", func(t *testing.T) {
		mine := socketInodes(t, pid)
		allowedTCP := map[int]string{2379: "embedded etcd (clients)", 2380: "embedded etcd (peers)", 9091: "metrics", 179: "BGP"}
		var listening []string
		for _, s := range procInetSockets(t, pid) {
			if !mine[s.inode] {
				continue // another process of the netns (dockerd, containerd)
			}
			isTCP := strings.HasPrefix(s.proto, "tcp")
			if isTCP && s.state != "0A" {
				continue // a connection, e.g. to its own etcd
			}
			listening = append(listening, s.String())
			if !isTCP {
				t.Errorf("the daemon has a UDP socket: %s", s)
				continue
			}
			if s.port == 179 {
				if s.local.String() != bgpAddr {
					t.Errorf("BGP listens on %s, not on the configured %s", s, bgpAddr)
				}
			} else if !s.local.IsLoopback() {
				t.Errorf("the daemon listens on a non-loopback address: %s", s)
			}
			if allowedTCP[s.port] == "" {
				t.Errorf("the daemon listens on an unexpected port: %s", s)
			}
		}
		t.Logf("inet listeners of the daemon: %v", listening)
		if len(listening) != len(allowedTCP) {
			t.Errorf("%d inet listeners, want exactly %d (%v): %v", len(listening), len(allowedTCP), allowedTCP, listening)
		}
		unix := listeningUnixPaths(t, pid, mine)
		// The BGP and WireGuard status sockets (for `node status`, and
		// `node rotate-key`) are the only other ones, and root's alone.
		statusSockets := []string{filepath.Join(h.StateDir, "bgp.sock"), filepath.Join(h.StateDir, wireguard.SocketName)}
		want := append([]string{filepath.Join(h.PluginDir, harness.NetworkSocket), filepath.Join(h.PluginDir, harness.IpamSocket)}, statusSockets...)
		sort.Strings(want)
		if strings.Join(unix, ",") != strings.Join(want, ",") {
			t.Errorf("unix listeners %v, want exactly the plugin and status sockets %v", unix, want)
		}
		for _, p := range statusSockets {
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("status socket %s: %v, %v; want mode 0600", p, fi, err)
			}
		}
	})

	t.Run("non-loopback metrics refused", func(t *testing.T) {
		for _, addr := range []string{"0.0.0.0:9092", ":9092", h.IP.String() + ":9092"} {
			// Bounded: a daemon that wrongly starts must not hold the test.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := h.ExecCtx(ctx, h.bin, "serve", "--socket-dir", t.TempDir(), "--state-dir", t.TempDir(), "--nodename", "probe",
				"--etcd-endpoints", "http://127.0.0.1:1", "--metrics-listen", addr)
			cancel()
			if err == nil {
				t.Errorf("serve --metrics-listen %s started: %s", addr, out)
				continue
			}
			if !strings.Contains(err.Error(), "loopback") {
				t.Errorf("serve --metrics-listen %s: error does not say it must be loopback: %v", addr, err)
			}
		}
	})
}
