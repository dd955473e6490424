// Package netnstest gives integration tests a throw-away network
// namespace.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// New makes a network namespace named prefix-<random>, removed when t
// ends, and returns an rtnetlink handle into it. Under -short, without
// root, or where the kernel refuses, it skips loudly, naming what goes
// unverified (unverified: "the netlink shaping").
func New(t testing.TB, prefix, unverified string) *netlink.Handle {
	t.Helper()
	name := NewNamed(t, prefix, unverified)
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// NewNamed is New for code that opens the namespace itself: it returns
// the namespace's name (its path is /var/run/netns/<name>).
func NewNamed(t testing.TB, prefix, unverified string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("!!!!!! SKIPPED under -short: this integration test creates a network namespace; %s is NOT verified by this run !!!!!!", unverified)
	}
	if os.Geteuid() != 0 {
		t.Skipf("!!!!!! SKIPPED: this integration test needs root to create a network namespace; %s is NOT verified by this run !!!!!!", unverified)
	}
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := prefix + "-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("!!!!!! SKIPPED: cannot create a network namespace (%v: %s); %s is NOT verified by this run !!!!!!", err, out, unverified)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}
