package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/policy/selector"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// hostMetricsAddr is where the host endpoint tests' daemons serve
// /metrics (each in its own namespace).
const hostMetricsAddr = "127.0.0.1:9466"

// readmeResources decodes the README's ```yaml block between
// <!-- NAME:begin --> and <!-- NAME:end -->.
func readmeResources(t *testing.T, name string) api.Resources {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	open := "<!-- " + name + ":begin -->\n```yaml\n"
	begin, end := strings.Index(s, open), strings.Index(s, "```\n<!-- "+name+":end -->")
	if begin < 0 || end < begin {
		t.Fatalf("README.md has no %s yaml block", name)
	}
	res, err := api.DecodeResources(strings.NewReader(s[begin+len(open) : end]))
	if err != nil {
		t.Fatalf("README %s: %v", name, err)
	}
	return res
}

// applyResources writes res as one YAML file and applies it with the CLI.
func (c *bgpCluster) applyResources(t *testing.T, res api.Resources) {
	t.Helper()
	var docs []string
	add := func(v any) {
		b, err := api.YAML(v)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	for _, n := range res.NetworkSets {
		add(n)
	}
	for _, h := range res.HostEndpoints {
		add(h)
	}
	for _, p := range res.Policies {
		add(p)
	}
	file := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(t, "apply", "-f", file)
}

// tcpFrom connects from h's namespace (a host, not a container) to addr
// and returns what the server says; the connect gives up after 2 s.
func tcpFrom(h *harness.Host, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hostPort, port, _ := net.SplitHostPort(addr)
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%s && timeout 1 cat <&3", hostPort, port)
	return h.ExecCtx(ctx, "timeout", "2", "bash", "-c", script)
}

// metricSum is the sum of the /metrics samples of name whose labels
// include every one of labels (`k="v"`).
func metricSum(t *testing.T, h *harness.Host, name string, labels ...string) float64 {
	t.Helper()
	out, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+hostMetricsAddr+"/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	sum := 0.0
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{([^}]*)\} (\S+)$`)
next:
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		for _, l := range labels {
			if !strings.Contains(m[1], l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("/metrics sample %s: %v", m[0], err)
		}
		sum += v
	}
	return sum
}

// TestHostEndpointPreDNAT applies the README's web-from-office file to a
// host whose container publishes port 8080: the office client connects,
// another client is refused, a container of the network on another host
// still reaches the container's own port, and the policy's counters in
// /metrics move. Then a deny-all host policy: the failsafe port (BGP 179)
// stays reachable while a host service on another port is cut; and so it
// does under a deny-all pre-DNAT policy.
func TestHostEndpointPreDNAT(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a := c.addHostTB(t, "hepA", "--metrics-listen", hostMetricsAddr)
	b := c.addHost(t, "hepB")
	office := c.fabric.AddHost(t, "hepOK", harness.HostOptions{NoDockerd: true})
	other := c.fabric.AddHost(t, "hepNO", harness.HostOptions{NoDockerd: true})
	a.MustDocker(t, "run", "-d", "--name", "web", "--net", mhNetwork, "-p", "8080:80", harness.Image, "nc", "-ll", "-p", "80", "-e", "echo", "web")
	webIP := a.ipOf(t, "web")
	b.run(t, "peer")
	published := net.JoinHostPort(a.IP.String(), "8080")
	for _, h := range []*harness.Host{office, other} {
		harness.Eventually(t, 10*time.Second, 200*time.Millisecond, h.Name+" reaches the published port before any policy", func() error {
			return served(tcpFrom(h, published))
		})
	}

	res := readmeResources(t, "host-policy-file")
	hep := strings.ToLower(a.Name) + "-eth0"
	res.HostEndpoints[0].Metadata.Name = hep
	res.HostEndpoints[0].Spec.Node = a.Name
	res.HostEndpoints[0].Spec.ExpectedIPs = []string{a.IP.String()}
	res.NetworkSets[0].Spec.Nets = []string{office.IP.String() + "/32"}
	c.applyResources(t, res)
	if out := c.mustCtl(t, "get", "hostendpoint"); !strings.Contains(out, hep) || !strings.Contains(out, "eth0") {
		t.Errorf("get hostendpoint:\n%s", out)
	}

	harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "the other client is refused the published port", func() error {
		if out, err := tcpFrom(other, published); err == nil {
			return fmt.Errorf("connected: %q", out)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "the office client reaches the published port", func() error {
		return served(tcpFrom(office, published))
	})
	if out, err := tcpFrom(other, published); err == nil {
		t.Errorf("the other client connected again: %q", out)
	}
	b.expect(t, "peer", webIP, 80, true, "a container of the network on another host, to the container's own port")

	denied := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="web-from-office"`, `rule="ingress[1]"`, `action="Deny"`)
	allowed := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="web-from-office"`, `rule="ingress[0]"`, `action="Allow"`)
	if denied < 1 || allowed < 1 {
		t.Errorf("/metrics: web-from-office denied %v, allowed %v packets; want both counted", denied, allowed)
	}
	if _, err := tcpFrom(other, published); err == nil {
		t.Errorf("the other client connected")
	}
	if after := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="web-from-office"`, `rule="ingress[1]"`); after <= denied {
		t.Errorf("the Deny rule's counter did not move with a refused connection: %v -> %v", denied, after)
	}

	// A deny-all host policy: the host's own service on a port that is not
	// failsafe is cut; BGP (179, failsafe) still answers.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte("host service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	service := net.JoinHostPort(a.IP.String(), "8099")
	a.StartProcess(t, "hostweb", nil, harness.TCPReady(service), "/bin/busybox", "httpd", "-f", "-p", "8099", "-h", dir)
	bgp := net.JoinHostPort(a.IP.String(), "179")
	failsafeAnswers := func(under string) {
		t.Helper()
		for _, h := range []*harness.Host{office, other, b.Host} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			out, err := h.ExecCtx(ctx, "timeout", "2", "bash", "-c", "exec 3<>/dev/tcp/"+a.IP.String()+"/179")
			cancel()
			if err != nil {
				t.Errorf("failsafe BGP port %s from %s under %s: %v %s", bgp, h.Name, under, err, out)
			}
		}
	}
	// denyAll applies a deny-all ingress policy of the host endpoint (pre-DNAT
	// or not) and waits until from is refused addr: then it is in force.
	file := filepath.Join(dir, "deny.yaml")
	denyAll := func(name, kind string, from *harness.Host, addr string) {
		t.Helper()
		y := "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: " + name + "}\n" +
			"spec:\n  order: 1\n  selector: role == 'docker-host'\n" + kind + "  types: [Ingress]\n  ingress: [{action: Deny}]\n"
		if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(t, "apply", "-f", file)
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, from.Name+" is refused "+addr+" under "+name, func() error {
			if out, err := tcpFrom(from, addr); err == nil {
				return fmt.Errorf("connected: %q", out)
			}
			return nil
		})
	}
	denyAll("deny-all-host", "", other, service)
	failsafeAnswers("a deny-all policy")
	// The BGP session between the hosts survives: b's container still
	// reaches a's through the routes it carries.
	b.expect(t, "peer", webIP, 80, true, "across hosts under deny-all (BGP failsafe)")

	// A deny-all pre-DNAT policy, ahead of web-from-office: once the office
	// client is refused the published port it is in force, and the
	// failsafe port still answers every host (prerouting accepts it before
	// any pre-DNAT policy).
	denyAll("deny-all-prednat", "  preDNAT: true\n  applyOnForward: true\n", office, published)
	failsafeAnswers("a deny-all pre-DNAT policy")
	if n := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="deny-all-prednat"`, `rule="ingress[0]"`, `action="Deny"`); n < 1 {
		t.Errorf("/metrics: deny-all-prednat denied %v packets; want the refused connection counted", n)
	}
}

// TestNetworkSetDenyList: the README's blocklist, updated while two
// clients on another host connect again and again to a server: adding the
// first client's address to the set stops its new connections within
// about a second (measured), the second keeps connecting, and the
// counters in /metrics (the Deny rule, the server's denied packets) move.
func TestNetworkSetDenyList(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a := c.addHostTB(t, "gnsA", "--metrics-listen", hostMetricsAddr)
	b := c.addHost(t, "gnsB")
	srvIP := a.server(t, "srv", "server", 7000)
	blocked := b.run(t, "blocked")
	b.run(t, "kept")
	res := readmeResources(t, "networkset-file")
	// Many networks, none of them the clients'.
	for i := 0; i < 1000; i++ {
		res.NetworkSets[0].Spec.Nets = append(res.NetworkSets[0].Spec.Nets, fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256))
	}
	c.applyResources(t, res)
	b.expect(t, "blocked", srvIP, 7000, true, "before the address is listed")
	b.expect(t, "kept", srvIP, 7000, true, "before the address is listed")

	endpoint := strings.TrimSpace(a.MustDocker(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).EndpointID}}`, mhNetwork), "srv"))
	deniedBefore := metricSum(t, a.Host, "calico_cnm_policy_denied_packets_total", `endpoint="`+endpoint+`"`, `direction="ingress"`)
	ruleBefore := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="blocklist"`, `rule="ingress[0]"`, `action="Deny"`)

	// While the clients keep connecting (each connection a fresh one):
	// the listed address is in a's kernel set (measured), and refused.
	stop := make(chan struct{})
	traffic := make(chan [2]int, 1) // connections made, failed
	go func() {
		var n [2]int
		for {
			select {
			case <-stop:
				traffic <- n
				return
			default:
			}
			if b.fetch("kept", srvIP, 7000) == nil {
				n[0]++
			} else {
				n[1]++
			}
		}
	}()
	set := policy.RuleSelectorSetName(selector.MustParse("list == 'blocked'"), false)
	listed := regexp.MustCompile(`[\s{]` + regexp.QuoteMeta(blocked.String()) + `[,\s}]`)
	res.NetworkSets[0].Spec.Nets = append(res.NetworkSets[0].Spec.Nets, blocked.String())
	start := time.Now()
	c.applyResources(t, api.Resources{NetworkSets: res.NetworkSets})
	applied := time.Since(start)
	harness.Eventually(t, 10*time.Second, 20*time.Millisecond, "the listed address in host a's set", func() error {
		out, err := a.Exec(t, "nft", "list", "set", "ip", policy.TableName, set)
		if err != nil || !listed.MatchString(out) {
			return fmt.Errorf("not in %s yet (%v)", set, err)
		}
		return nil
	})
	t.Logf("listed address in host a's kernel set %s after apply returned (apply took %s)", (time.Since(start) - applied).Round(time.Millisecond), applied.Round(time.Millisecond))
	b.expect(t, "blocked", srvIP, 7000, false, "the listed client, right after")
	close(stop)
	if n := <-traffic; n[0] == 0 || n[1] > 0 {
		t.Errorf("the unlisted client, while the set changed: %d connections made, %d failed; want some and none", n[0], n[1])
	} else {
		t.Logf("the unlisted client made %d connections while the set changed, none failed", n[0])
	}
	b.expect(t, "kept", srvIP, 7000, true, "an unlisted client keeps connecting")
	b.expect(t, "blocked", srvIP, 7000, false, "the listed client")

	if after := metricSum(t, a.Host, "calico_cnm_policy_rule_packets_total", `policy="blocklist"`, `rule="ingress[0]"`, `action="Deny"`); after <= ruleBefore {
		t.Errorf("blocklist's Deny rule counter did not move: %v -> %v", ruleBefore, after)
	}
	if after := metricSum(t, a.Host, "calico_cnm_policy_denied_packets_total", `endpoint="`+endpoint+`"`, `direction="ingress"`); after <= deniedBefore {
		t.Errorf("srv's denied packets did not move: %v -> %v", deniedBefore, after)
	}
	// Delisted: the client connects again.
	res.NetworkSets[0].Spec.Nets = res.NetworkSets[0].Spec.Nets[:len(res.NetworkSets[0].Spec.Nets)-1]
	c.applyResources(t, api.Resources{NetworkSets: res.NetworkSets})
	b.expect(t, "blocked", srvIP, 7000, true, "after the address is removed from the set")
	if out := c.mustCtl(t, "get", "globalnetworkset"); !strings.Contains(out, "blocklist") {
		t.Errorf("get globalnetworkset:\n%s", out)
	}
}
