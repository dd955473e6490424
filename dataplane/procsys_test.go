package dataplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWithProcSys covers the managed plugin's case: its own /proc/sys is
// read-only, and the host's is bind-mounted writable elsewhere.
func TestWithProcSys(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()

	t.Run("missing directory", func(t *testing.T) {
		tn := newTestNS(t)
		dir := filepath.Join(t.TempDir(), "nope")
		l, err := NewLinux(tn.path, testLogger(t), WithProcSys(dir))
		if err == nil {
			l.Close()
			t.Fatalf("NewLinux with sysctl dir %s succeeded", dir)
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("error does not name the directory: %v", err)
		}
	})

	t.Run("writes go to the given directory", func(t *testing.T) {
		tn := newTestNS(t)
		dir := t.TempDir()
		w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.9.1/32")}
		ifc := HostIfName(w.EndpointID)
		for _, d := range []string{"net/ipv4/conf/" + ifc, "net/ipv4/neigh/" + ifc} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		l, err := NewLinux(tn.path, testLogger(t), WithProcSys(dir))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatalf("AddWorkload: %v", err)
		}
		for key, want := range map[string]string{
			"net/ipv4/conf/" + ifc + "/proxy_arp":    "1",
			"net/ipv4/conf/" + ifc + "/forwarding":   "1",
			"net/ipv4/neigh/" + ifc + "/proxy_delay": "0",
		} {
			b, err := os.ReadFile(filepath.Join(dir, key))
			if err != nil || string(b) != want {
				t.Errorf("%s under %s = %q (%v), want %q", key, dir, b, err, want)
			}
		}
		// The kernel's own value is untouched: the writes did not go to
		// /proc/sys.
		if got := sysctlIn(t, l, "net/ipv4/conf/"+ifc+"/proxy_arp"); got != "0" {
			t.Errorf("/proc/sys proxy_arp of %s = %s, want the untouched 0", ifc, got)
		}
	})

	t.Run("a second mount of /proc/sys", func(t *testing.T) {
		// What config.json does for the managed plugin: the host's
		// /proc/sys bound elsewhere. /proc/sys/net follows the opening
		// thread's network namespace whatever the mount, so the writes
		// land in the target namespace.
		tn := newTestNS(t)
		dir := t.TempDir()
		if err := unix.Mount("/proc/sys", dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mounting /proc/sys on %s: %v", dir, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", dir, err)
			}
		})
		l, err := NewLinux(tn.path, testLogger(t), WithProcSys(dir))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.9.2/32")}
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatalf("AddWorkload: %v", err)
		}
		ifc := HostIfName(w.EndpointID)
		for _, key := range []string{"proxy_arp", "forwarding"} {
			if got := sysctlIn(t, l, "net/ipv4/conf/"+ifc+"/"+key); got != "1" {
				t.Errorf("%s of %s in the target namespace = %s, want 1", key, ifc, got)
			}
		}
		// Nothing of the namespace's interface leaked into the test's own
		// (root) namespace view.
		if _, err := os.Stat(filepath.Join("/proc/sys/net/ipv4/conf", ifc)); err == nil {
			t.Errorf("%s is visible in the root namespace's /proc/sys", ifc)
		}
	})
}
