package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// legacyBackend is one family's iptables-legacy: its tool, and the /proc
// file that lists the x_tables tables in use in a network namespace.
type legacyBackend struct {
	tool   string
	tables string // under /proc/thread-self/net
}

// legacyBackends returns both families' backends.
func legacyBackends() []legacyBackend {
	return []legacyBackend{{"iptables-legacy", "ip_tables_names"}, {"ip6tables-legacy", "ip6_tables_names"}}
}

// legacyForwardRules are the accept rules in iptables syntax: the same as
// the nftables ones, with the same comment.
func legacyForwardRules() [][]string {
	var rules [][]string
	for _, dir := range []string{"-o", "-i"} {
		rules = append(rules, []string{dir, "cali+", "-m", "comment", "--comment", forwardRuleComment, "-j", "ACCEPT"})
	}
	return rules
}

// ErrLegacyToolMissing: Docker's FORWARD filter is in the legacy x_tables
// table and the tool to edit it is not installed.
var ErrLegacyToolMissing = errors.New("not installed (package iptables)")

// ensureLegacyForwardAccept is EnsureForwardAccept for hosts whose Docker
// uses the iptables-legacy backend: its DROP policy and DOCKER-USER chain
// live in the kernel's x_tables filter table, which nftables cannot see.
// Only a namespace whose legacy filter table is in use is touched (reading
// /proc loads no module); the rules are inserted with the legacy tool,
// after checking (-C) that they are not there yet.
func (l *Linux) ensureLegacyForwardAccept(ctx context.Context) error {
	return inNetNS(l.ns, l.log, func() error {
		for _, b := range legacyBackends() {
			tool, chain, err := legacyForwardChain(ctx, b)
			if err != nil || tool == "" {
				return err
			}
			for _, rule := range legacyForwardRules() {
				if exec.CommandContext(ctx, tool, append([]string{"-w", "-C", chain}, rule...)...).Run() == nil {
					continue
				}
				out, err := exec.CommandContext(ctx, tool, append([]string{"-w", "-I", chain, "1"}, rule...)...).CombinedOutput()
				if err != nil {
					return fmt.Errorf("%s -I %s %s: %w: %s", b.tool, chain, strings.Join(rule, " "), err, strings.TrimSpace(string(out)))
				}
				l.log.WithField("chain", b.tool+" filter/"+chain).Info("accepting forwarded traffic of cali+ interfaces (Docker's iptables-legacy FORWARD policy drops it)")
			}
		}
		return nil
	})
}

// legacyForwardChain finds where b's rules go: "" when the namespace's
// legacy filter table is not in use, else the tool's path and DOCKER-USER
// (or FORWARD when Docker made no DOCKER-USER). It runs inside the
// namespace.
func legacyForwardChain(ctx context.Context, b legacyBackend) (tool, chain string, err error) {
	if !legacyFilterInUse(b.tables) {
		return "", "", nil
	}
	tool, err = exec.LookPath(b.tool)
	if err != nil {
		return "", "", fmt.Errorf("this host's FORWARD filter (Docker's) is in the iptables-legacy table, and %s, needed to let cali+ traffic through it, is %w", b.tool, ErrLegacyToolMissing)
	}
	if exec.CommandContext(ctx, tool, "-w", "-S", "DOCKER-USER").Run() == nil {
		return tool, "DOCKER-USER", nil
	}
	return tool, "FORWARD", nil
}

// legacyFilterInUse: the current thread's namespace has an x_tables filter
// table (some legacy iptables rule or policy was set in it).
func legacyFilterInUse(tablesFile string) bool {
	f, err := os.Open("/proc/thread-self/net/" + tablesFile)
	if err != nil {
		return false // x_tables not loaded: no legacy rules anywhere
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "filter" {
			return true
		}
	}
	return false
}

// removeLegacyForwardRules deletes the rules ensureLegacyForwardAccept
// added, from either chain.
func (l *Linux) removeLegacyForwardRules(ctx context.Context) error {
	return inNetNS(l.ns, l.log, func() error {
		for _, b := range legacyBackends() {
			tool, _, err := legacyForwardChain(ctx, b)
			if err != nil || tool == "" {
				return err
			}
			for _, chain := range []string{"DOCKER-USER", "FORWARD"} {
				for _, rule := range legacyForwardRules() {
					for exec.CommandContext(ctx, tool, append([]string{"-w", "-D", chain}, rule...)...).Run() == nil {
					}
				}
			}
		}
		return nil
	})
}
