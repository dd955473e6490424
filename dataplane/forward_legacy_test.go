package dataplane

import (
	"context"
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
	ws, ctrs := twoWorkloadsThroughHost(t, l, host)
	if err := l.EnsureForwardAccept(ctx); err != nil { // once more: idempotent
		t.Fatal(err)
	}
	pingAcross(t, pingCmd, ws, ctrs, " (legacy FORWARD policy DROP)")
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
