package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// policyLabel is the Docker label prefix that becomes an endpoint label.
const policyLabel = policy.LabelPrefix + "role="

// threeTierFile is the README's policy: frontend -> backend TCP 8080,
// backend -> db TCP 5432, nothing else between them.
func threeTierFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../policy/api/testdata/three-tier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// server starts a TCP server on port in a container with a role label:
// every connection gets the container's name. (busybox nc: the static
// busybox's wget crashes, so the clients use nc too.)
func (h *bgpHost) server(t *testing.T, name, role string, port int) net.IP {
	t.Helper()
	h.MustDocker(t, "run", "-d", "--name", name, "--net", mhNetwork, "--label", policyLabel+role, harness.Image,
		"nc", "-ll", "-p", fmt.Sprint(port), "-e", "echo", name)
	return h.ipOf(t, name)
}

// connectArgs is a TCP connection with a 2 s connect timeout that prints
// what the server says.
func connectArgs(to net.IP, port int) []string {
	return []string{"nc", "-w", "2", to.String(), fmt.Sprint(port)}
}

// served: the connection got through to a server (which names itself).
func served(out string, err error) error {
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(out))
	}
	if strings.TrimSpace(out) == "" {
		return fmt.Errorf("connected, but the server said nothing")
	}
	return nil
}

func (h *bgpHost) ipOf(t *testing.T, name string) net.IP {
	t.Helper()
	tmpl := fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, mhNetwork)
	ip := net.ParseIP(strings.TrimSpace(h.MustDocker(t, "inspect", "-f", tmpl, name)))
	if ip == nil {
		t.Fatalf("%s: container %s has no address", h.Name, name)
	}
	return ip
}

// fetch is one connection from a running container.
func (h *bgpHost) fetch(from string, to net.IP, port int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return served(h.DockerCtx(ctx, append([]string{"exec", from}, connectArgs(to, port)...)...))
}

// expect checks a connection's result, allowing a few tries for a
// success (the first packet may wait for ARP across the fabric); a denial
// must hold on every try.
func (h *bgpHost) expect(t *testing.T, from string, to net.IP, port int, allowed bool, what string) {
	t.Helper()
	if !allowed {
		if err := h.fetch(from, to, port); err == nil {
			t.Errorf("%s: %s reached %s:%d, want denied", what, from, to, port)
		}
		return
	}
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, fmt.Sprintf("%s: %s reaches %s:%d", what, from, to, port), func() error {
		return h.fetch(from, to, port)
	})
}

// policyRules lists this host's rules of a policy chain.
func (h *bgpHost) policyRules(t *testing.T, name string, dir api.PolicyType) ([]string, bool) {
	t.Helper()
	out, err := h.Exec(t, "nft", "list", "chain", "ip", policy.TableName, policy.PolicyChainName(name, dir))
	if err != nil {
		return nil, false
	}
	return regexp.MustCompile(`comment "[^"]*rule \d+: \w+"`).FindAllString(out, -1), true
}

// waitPolicyRules waits until the host's chain of the policy has n rules
// (-1: the chain is gone) and says how long it took.
func (h *bgpHost) waitPolicyRules(t *testing.T, name string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	harness.Eventually(t, 10*time.Second, 20*time.Millisecond, fmt.Sprintf("%s: policy %s has %d rules", h.Name, name, n), func() error {
		rules, ok := h.policyRules(t, name, api.Ingress)
		switch {
		case n < 0 && ok:
			return fmt.Errorf("chain still there: %v", rules)
		case n >= 0 && len(rules) != n:
			return fmt.Errorf("%d rules: %v", len(rules), rules)
		}
		return nil
	})
	return time.Since(start)
}

// TestPolicyThreeTier: the README's three-tier policy across two hosts,
// a change enforced on the other host, labels in force from a new
// container's first packet, and nothing left once the policy and the
// containers are gone.
func TestPolicyThreeTier(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "a"), c.addHost(t, "b")
	fe := "fe"
	a.MustDocker(t, "run", "-d", "--name", fe, "--net", mhNetwork, "--label", policyLabel+"frontend", harness.Image, "sleep", "3600")
	be := b.server(t, "be", "backend", 8080)
	db := a.server(t, "db", "db", 5432)
	t.Logf("backend %s (host b), db %s (host a)", be, db)

	// No policy: the network's own rules (one network: all allowed).
	a.expect(t, fe, db, 5432, true, "no policy")
	a.expect(t, fe, be, 8080, true, "no policy")

	dir := t.TempDir()
	file := filepath.Join(dir, "three-tier.yaml")
	if err := os.WriteFile(file, []byte(threeTierFile(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(t, "apply", "-f", file)
	for _, h := range []*bgpHost{a, b} {
		h.waitPolicyRules(t, "three-tier", 3)
	}
	a.expect(t, fe, be, 8080, true, "frontend -> backend (across hosts)")
	a.expect(t, fe, db, 5432, false, "frontend -> db (same host)")
	b.expect(t, "be", db, 5432, true, "backend -> db (across hosts)")

	// The denied attempts were counted by the Deny rule on host a, where
	// the db is: per-rule counters of this host.
	wide := a.MustExec(t, c.bin, "get", "policy", "three-tier", "-o", "wide", "--etcd-endpoints", c.etcd)
	if m := regexp.MustCompile(`(?m)^three-tier\s+ingress\[2\]\s+Deny\s+(\d+)`).FindStringSubmatch(wide); m == nil || m[1] == "0" {
		t.Errorf("get policy -o wide on host a does not count the denied packets:\n%s", wide)
	}

	// A container's first instruction meets its policy: labels are known
	// and its rules programmed before Join returns.
	first := func(role string, to net.IP, port int) error {
		return served(a.Docker(t, append([]string{"run", "--rm", "--net", mhNetwork, "--label", policyLabel + role, harness.Image},
			connectArgs(to, port)...)...))
	}
	if err := first("frontend", be, 8080); err != nil {
		t.Errorf("a new frontend's first request to the backend failed: %v", err)
	}
	if err := first("frontend", db, 5432); err == nil {
		t.Error("a new frontend's first request to the db succeeded, want denied")
	}
	if err := first("backend", db, 5432); err != nil {
		t.Errorf("a new backend's first request to the db failed: %v", err)
	}

	// docker network connect of a running container: Docker holds the
	// container while it joins; the network's endpoint list names it, so
	// its labels are known at Join.
	a.MustDocker(t, "run", "-d", "--name", "late", "--net", mhNetwork, "--label", policyLabel+"frontend", harness.Image, "sleep", "3600")
	a.MustDocker(t, "network", "disconnect", mhNetwork, "late")
	a.MustDocker(t, "network", "connect", mhNetwork, "late")
	a.expect(t, "late", be, 8080, true, "a frontend connected while running -> backend")
	a.expect(t, "late", db, 5432, false, "a frontend connected while running -> db")
	if out := c.mustCtl(t, "get", "endpoints", "-o", "wide"); !regexp.MustCompile(`role=frontend\s+three-tier`).MatchString(out) {
		t.Errorf("get endpoints does not show the labelled, selected endpoints:\n%s", out)
	}
	a.MustDocker(t, "rm", "-f", "late")

	// Apply a change (backend -> db no longer allowed): host a, where the
	// db is, enforces it without restarting anything.
	changed := strings.Replace(threeTierFile(t), "  - action: Allow\n    protocol: TCP\n    source:\n      selector: role == 'backend'\n    destination:\n      selector: role == 'db'\n      ports: [5432]\n", "", 1)
	if changed == threeTierFile(t) {
		t.Fatal("test bug: the backend -> db rule was not removed")
	}
	if err := os.WriteFile(file, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.mustCtl(t, "apply", "-f", file)
	took := a.waitPolicyRules(t, "three-tier", 2)
	t.Logf("policy change enforced on host a %s after apply returned (%s including apply)", took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	b.expect(t, "be", db, 5432, false, "backend -> db after the change")
	a.expect(t, fe, be, 8080, true, "frontend -> backend after the change")

	// Deleting the policy restores the network's behaviour.
	c.mustCtl(t, "delete", "policy", "three-tier")
	for _, h := range []*bgpHost{a, b} {
		h.waitPolicyRules(t, "three-tier", -1)
	}
	a.expect(t, fe, db, 5432, true, "frontend -> db without the policy")
	b.expect(t, "be", db, 5432, true, "backend -> db without the policy")

	// Apply again, then remove the containers: no chain, rule or set
	// element of theirs is left on either host.
	if err := os.WriteFile(file, []byte(threeTierFile(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(t, "apply", "-f", file)
	a.waitPolicyRules(t, "three-tier", 3)
	a.MustDocker(t, "rm", "-f", fe, "db")
	b.MustDocker(t, "rm", "-f", "be")
	for _, h := range []*bgpHost{a, b} {
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, h.Name+": nothing of the removed endpoints left", func() error {
			out := h.MustExec(t, "nft", "list", "table", "ip", policy.TableName)
			for _, ip := range []net.IP{be, db} {
				if strings.Contains(out, ip.String()) {
					return fmt.Errorf("%s still in the tables:\n%s", ip, out)
				}
			}
			if m := regexp.MustCompile(`chain (to|from|pi|po)-\w+`).FindAllString(out, -1); len(m) > 0 {
				return fmt.Errorf("policy chains left: %v", m)
			}
			if m := regexp.MustCompile(`[io]ifname "cali[0-9a-zA-Z]+"`).FindAllString(out, -1); len(m) > 0 {
				return fmt.Errorf("endpoint rules left: %v", m)
			}
			return nil
		})
	}
}
