package dataplane

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
)

// TestLegacyForwardDrop: a host whose Docker uses the iptables-legacy
// backend (FORWARD policy DROP, DOCKER-USER jumped to first, all in the
// legacy x_tables filter table, which nftables cannot see). Workload traffic
// routed through the host must pass, in both families; the accept rules are
// in DOCKER-USER exactly once however often they are ensured, and go again
// on removal (issue 12 item 7).
func TestLegacyForwardDrop(t *testing.T) {
	requireRoot(t)
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("SKIPPED LOUDLY: %s not found (package iptables; scripts/install-deps.sh installs it)", bin)
		}
	}
	pingCmd := pingCommand(t)
	l, host := newTestLinux(t)
	ctx := context.Background()
	legacy := func(bin string, args ...string) string {
		return run(t, append([]string{"ip", "netns", "exec", host.name, bin, "-w"}, args...)...)
	}
	// What dockerd --iptables does on a legacy host.
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy"} {
		legacy(bin, "-P", "FORWARD", "DROP")
		legacy(bin, "-N", "DOCKER-USER")
		legacy(bin, "-A", "DOCKER-USER", "-j", "RETURN")
		legacy(bin, "-I", "FORWARD", "-j", "DOCKER-USER")
	}
	hostIP := func(args ...string) { run(t, append([]string{"ip", "-n", host.name}, args...)...) }
	host.addUplink(t)
	hostIP("addr", "add", "192.0.2.1/24", "dev", "uplink0")
	hostIP("route", "add", "default", "via", "192.0.2.254", "dev", "uplink0")

	ws := []Workload{
		{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "198.51.100.1/32"), IPv6: mustCIDR(t, "fd00:c0de::1/128")},
		{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "198.51.100.2/32"), IPv6: mustCIDR(t, "fd00:c0de::2/128")},
	}
	ctrs := []*testNS{newTestNS(t), newTestNS(t)}
	for i, w := range ws {
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatal(err)
		}
		moveToContainer(t, host, ctrs[i], w)
	}
	if err := l.EnsureForwardAccept(ctx); err != nil { // once more: idempotent
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from int
		to   net.IP
	}{
		{0, ws[1].IPv4.IP}, {1, ws[0].IPv4.IP},
		{0, ws[1].IPv6.IP}, {1, ws[0].IPv6.IP},
	} {
		if err := ping(t, pingCmd, ctrs[tc.from], tc.to); err != nil {
			t.Errorf("container %d cannot reach %s through a host whose legacy FORWARD policy is DROP: %v", tc.from, tc.to, err)
		}
	}
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy"} {
		out := legacy(bin, "-S", "DOCKER-USER")
		if n := strings.Count(out, forwardRuleComment); n != 2 {
			t.Errorf("%s DOCKER-USER: want the 2 accept rules once, got %d:\n%s", bin, n, out)
		}
		if !strings.Contains(out, "-A DOCKER-USER -i cali+") || !strings.Contains(out, "-A DOCKER-USER -o cali+") {
			t.Errorf("%s DOCKER-USER lacks -i/-o cali+ accepts:\n%s", bin, out)
		}
	}
	if err := l.removeForwardRules(); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy"} {
		if out := legacy(bin, "-S"); strings.Contains(out, forwardRuleComment) {
			t.Errorf("%s rules left after removal:\n%s", bin, out)
		}
	}
}
