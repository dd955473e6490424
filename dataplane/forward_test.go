package dataplane

import (
	"context"
	"strings"
	"testing"
)

// TestEnsureForwardAccept proves the rules land where Docker's DROP policy
// would otherwise eat routed traffic, exactly once, and that iptables reads
// them as the familiar -i/-o cali+ ACCEPT.
func TestEnsureForwardAccept(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name      string
		setup     []string // nft commands run in the namespace first
		wantChain string   // "" = no rule expected anywhere
	}{
		{name: "no filter table", wantChain: ""},
		{
			name:      "docker FORWARD policy drop with DOCKER-USER",
			setup:     []string{"add table ip filter", "add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }", "add chain ip filter DOCKER-USER", "add rule ip filter DOCKER-USER counter return"},
			wantChain: "DOCKER-USER",
		},
		{
			name:      "FORWARD only",
			setup:     []string{"add table ip filter", "add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }"},
			wantChain: "FORWARD",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, ns := newTestLinux(t)
			nft := func(args ...string) string {
				return run(t, append([]string{"ip", "netns", "exec", ns.name, "nft"}, args...)...)
			}
			for _, c := range tc.setup {
				nft(c)
			}
			for i := 0; i < 2; i++ { // twice: idempotent
				if err := l.EnsureForwardAccept(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			out := nft("-a", "list", "ruleset")
			n := strings.Count(out, forwardRuleComment)
			if tc.wantChain == "" {
				if n != 0 {
					t.Fatalf("rules added with no filter table:\n%s", out)
				}
				return
			}
			if n != 2 {
				t.Fatalf("want exactly 2 rules (iif and oif), got %d:\n%s", n, out)
			}
			chainOut := nft("list", "chain", "ip", "filter", tc.wantChain)
			for _, want := range []string{`iifname "cali*"`, `oifname "cali*"`, "accept"} {
				if !strings.Contains(chainOut, want) {
					t.Errorf("chain %s lacks %q:\n%s", tc.wantChain, want, chainOut)
				}
			}
			if err := l.removeForwardRules(); err != nil {
				t.Fatal(err)
			}
			if out := nft("list", "ruleset"); strings.Contains(out, forwardRuleComment) {
				t.Fatalf("rules left after removal:\n%s", out)
			}
		})
	}
}
