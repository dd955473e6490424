package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// Containers started together (docker-compose up of 6 labelled services x
// 2 replicas) each connect, as their very first instruction, to a server a
// policy allows to some roles only, then, once every replica listens, to
// every replica at once; nothing retries (busybox nc -w 1: a dropped first
// SYN is a failed connection).
const (
	togetherRoles    = 6
	togetherReplicas = 2
	togetherPort     = 80
	togetherServer   = "srv"
)

// togetherScript is every replica's command. It prints one line per
// connection, "<target> ok" or "<target> fail <why>", to a file of its own
// under /sync/res. The first connection has no retry: it is what the test
// is about. The mesh, once everyone is up, checks the policy in steady
// state, so it tries a failed connection once more (a denied one fails
// twice): on a loaded machine a busybox server may take longer than the
// 1 s timeout. A name is looked up (Docker's resolver, inside the
// container: no packet to the target) before the timed connect, with
// retries: a slow answer from a loaded dockerd is not what is tested.
const togetherScript = `#!/bin/sh
me=$(hostname)
addr() { i=0; while [ $i -lt 10 ]; do a=$(nslookup -type=a "$1" 2>/dev/null | awk '/^Address: [0-9.]+$/ {print $2; exit}'); [ -n "$a" ] && { echo "$a"; return; }; i=$((i+1)); sleep 0.2; done; }
try() {
  a=$(addr "$1")
  if [ -z "$a" ]; then echo "$1 fail (no address)"; return; fi
  if nc -w 1 "$a" ` + "80" + ` </dev/null >/tmp/out 2>&1 && [ -s /tmp/out ]; then echo "$1 ok"; else echo "$1 fail ($a: $(head -c 60 /tmp/out | tr '\n' ' '))"; fi
}
try ` + togetherServer + ` > /sync/res/first-$ROLE-$me
nc -ll -p 80 -e echo "$ROLE" &
i=0; until netstat -ltn | grep -q ':80 '; do sleep 0.01; i=$((i+1)); [ $i -gt 500 ] && break; done
touch /sync/ready/$me
i=0; while [ "$(ls /sync/ready | wc -l)" -lt "$PEERS" ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done
for t in $TARGETS; do r=$(try "$t"); case "$r" in *ok) echo "$r";; *) try "$t";; esac; done > /sync/res/.mesh-$ROLE-$me
mv /sync/res/.mesh-$ROLE-$me /sync/res/mesh-$ROLE-$me
exec sleep 3600
`

// togetherRole is the role label of service k.
func togetherRole(k int) string { return fmt.Sprintf("r%d", k) }

// togetherAllowed: a replica of role from may reach one of role to when
// to is its own role or the next one (a ring); the server admits the even
// roles.
func togetherAllowed(from, to int) bool {
	return to == from || to == (from+1)%togetherRoles
}

// togetherPolicy is the ring as one GlobalNetworkPolicy (anything else to
// a selected endpoint is denied).
func togetherPolicy() string {
	var b strings.Builder
	b.WriteString("apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata:\n  name: together\nspec:\n  selector: has(role)\n  types: [Ingress]\n  ingress:\n")
	fmt.Fprintf(&b, "  - action: Allow\n    protocol: TCP\n    source: {selector: \"role in {'r0', 'r2', 'r4'}\"}\n    destination: {selector: \"role == '%s'\", ports: [%d]}\n", togetherServer, togetherPort)
	for to := 0; to < togetherRoles; to++ {
		from := (to + togetherRoles - 1) % togetherRoles
		fmt.Fprintf(&b, "  - action: Allow\n    protocol: TCP\n    source: {selector: \"role in {'%s', '%s'}\"}\n    destination: {selector: \"role == '%s'\", ports: [%d]}\n",
			togetherRole(to), togetherRole(from), togetherRole(to), togetherPort)
	}
	return b.String()
}

// togetherCompose is the compose file of project proj; dir is mounted as
// /sync.
func togetherCompose(proj, dir string) string {
	var targets []string
	for k := 0; k < togetherRoles; k++ {
		for r := 1; r <= togetherReplicas; r++ {
			targets = append(targets, fmt.Sprintf("%s_s%d_%d", proj, k, r))
		}
	}
	var b strings.Builder
	b.WriteString("version: \"2.4\"\nservices:\n")
	for k := 0; k < togetherRoles; k++ {
		// Each role starts its mesh at its own service: the servers answer
		// one connection at a time (busybox nc), and twelve clients all
		// starting at s0 queued up past the clients' 1 s timeout on a
		// loaded machine.
		mine := append(slices.Clone(targets[k*togetherReplicas:]), targets[:k*togetherReplicas]...)
		fmt.Fprintf(&b, "  s%d:\n    image: %s\n    scale: %d\n    labels:\n      %srole: %s\n    environment:\n      ROLE: %s\n      PEERS: \"%d\"\n      TARGETS: %s\n    volumes: [\"%s:/sync\"]\n    command: [\"sh\", \"/sync/run.sh\"]\n",
			k, harness.Image, togetherReplicas, policy.LabelPrefix, togetherRole(k), togetherRole(k), togetherRoles*togetherReplicas, strings.Join(mine, " "), dir)
	}
	fmt.Fprintf(&b, "networks:\n  default:\n    external:\n      name: %s\n", mhNetwork)
	return b.String()
}

// TestComposeStartedTogetherPolicy: in 5 rounds, docker-compose up -d of 12
// labelled containers: every allowed first connection succeeds and every
// denied one is denied, those of each container's first instruction and
// those between the containers started together. Rounds 1, 3 and 5 run
// here, 2 and 4 in TestComposeStartedTogetherPolicySecondCluster, side by
// side, each on a cluster of its own: a round is mostly waiting for denied
// connections to time out. (Two top-level tests, not parallel subtests:
// Go starts those only once their parent returns, behind every top-level
// test still waiting.)
func TestComposeStartedTogetherPolicy(t *testing.T) {
	t.Parallel()
	composeStartedTogether(t, "a", 1, 3, 5)
}

// TestComposeStartedTogetherPolicySecondCluster is rounds 2 and 4 of
// TestComposeStartedTogetherPolicy.
func TestComposeStartedTogetherPolicySecondCluster(t *testing.T) {
	t.Parallel()
	composeStartedTogether(t, "b", 2, 4)
}

// composeStartedTogether runs the given rounds on a new cluster's host
// (name) with the together policy applied.
func composeStartedTogether(t *testing.T, name string, rounds ...int) {
	harness.RequireFile(t, "/usr/bin/docker-compose", "docker-compose (Debian package docker-compose)")
	c := newBGPCluster(t)
	h := c.addHostOn(t, c.fabric, name)
	h.MustDocker(t, "run", "-d", "--name", togetherServer, "--net", mhNetwork, "--label", policyLabel+togetherServer, harness.Image,
		"nc", "-ll", "-p", fmt.Sprint(togetherPort), "-e", "echo", togetherServer)
	file := filepath.Join(t.TempDir(), "together.yaml")
	if err := os.WriteFile(file, []byte(togetherPolicy()), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(t, "apply", "-f", file)
	h.waitPolicyRules(t, "together", 1+togetherRoles)
	for _, round := range rounds {
		bad := runTogether(t, h, fmt.Sprintf("round%d", round))
		if len(bad) > 0 {
			t.Errorf("round %d: %d connection(s) not as the policy says:\n%s\nhow the daemon labelled the joining containers:\n%s",
				round, len(bad), strings.Join(bad, "\n"), labelLines(h.plugin.LogPath))
		}
	}
}

// labelLines are the lines of a daemon's log that say where a joining
// endpoint's labels came from other than Docker naming its container
// (a guess, or none), for a round that failed.
func labelLines(logPath string) string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, s := range []string{"not named by Docker", "learnt the labels", "cannot learn the container's labels"} {
			if strings.Contains(line, s) {
				out = append(out, line)
				break
			}
		}
	}
	if len(out) == 0 {
		return "(none: Docker named every joining container)"
	}
	return strings.Join(out, "\n")
}

// runTogether brings a project of togetherCompose up, collects every
// container's results, takes it down and returns the connections whose
// outcome is not what the policy says.
func runTogether(t *testing.T, h *bgpHost, proj string) []string {
	t.Helper()
	ok, total, bad := runTogetherCounts(t, h, proj)
	t.Logf("%s: %d of %d first connections as the policy says", proj, ok, total)
	return bad
}

// runTogetherCounts is runTogether with the number of connections as
// expected and in all.
func runTogetherCounts(tb testing.TB, h *bgpHost, proj string) (ok, total int, bad []string) {
	tb.Helper()
	dir := tb.TempDir()
	for _, d := range []string{"res", "ready"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o777); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(togetherScript), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "docker-compose.yml"), []byte(togetherCompose(proj, dir)), 0o644); err != nil {
		tb.Fatal(err)
	}
	compose := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/usr/bin/docker-compose", append([]string{"-p", proj}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "DOCKER_HOST=" + h.DockerHost(), "HOME=" + dir, "DOCKER_CONFIG=" + dir}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	down := func() {
		if out, err := compose("down", "--remove-orphans", "-t", "0"); err != nil {
			tb.Errorf("docker-compose down: %v\n%s", err, out)
		}
	}
	if out, err := compose("up", "-d"); err != nil {
		down()
		tb.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	defer down()
	n := togetherRoles * togetherReplicas
	var files []string
	harness.Eventually(tb, 2*time.Minute, 200*time.Millisecond, proj+": every container reported", func() error {
		var err error
		files, err = filepath.Glob(filepath.Join(dir, "res", "mesh-*"))
		if err != nil {
			return err
		}
		if len(files) < n {
			return fmt.Errorf("%d of %d reported", len(files), n)
		}
		return nil
	})
	firsts, err := filepath.Glob(filepath.Join(dir, "res", "first-*"))
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(files)
	for _, f := range append(firsts, files...) {
		base := filepath.Base(f)
		var from int
		if _, err := fmt.Sscanf(strings.SplitN(base, "-", 2)[1], "r%d-", &from); err != nil {
			tb.Fatalf("result file %s: %v", base, err)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			target, result, found := strings.Cut(line, " ")
			if !found {
				tb.Fatalf("%s: unexpected line %q", base, line)
			}
			want := from%2 == 0 // the server admits the even roles
			if target != togetherServer {
				var to, r int
				if _, err := fmt.Sscanf(strings.TrimPrefix(target, proj+"_"), "s%d_%d", &to, &r); err != nil {
					tb.Fatalf("%s: target %q: %v", base, target, err)
				}
				want = togetherAllowed(from, to)
			}
			total++
			if (result == "ok") == want {
				ok++
				continue
			}
			bad = append(bad, fmt.Sprintf("  %s (role r%d) -> %s: %s, want allowed=%v", strings.TrimPrefix(base, "mesh-"), from, target, result, want))
		}
	}
	if len(firsts) != n {
		tb.Errorf("%s: %d first-instruction results, want %d", proj, len(firsts), n)
	}
	return ok, total, bad
}
