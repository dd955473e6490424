package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// policyLab is a calico host whose dockerd manages iptables, as in
// production (so its FORWARD policy is DROP and the cali accepts sit in
// DOCKER-USER), and an "outside" host on the same fabric, without dockerd
// and without any route to the pools: only masquerading lets it answer.
type policyLab struct {
	*calicoHost
	outside *harness.Host
}

func newPolicyLab(t *testing.T) *policyLab {
	t.Helper()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	f := harness.NewFabric(t, "")
	h := f.AddHost(t, "policy", harness.HostOptions{Bridge: true})
	h.ImportBusybox(t)
	p := h.StartPlugin(t, bin, nil)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
			if out, err := h.Exec(t, "nft", "list", "ruleset"); err == nil {
				t.Logf("nft list ruleset on %s:\n%s", h.Name, out)
			}
		}
	})
	o := f.AddHost(t, "outside", harness.HostOptions{NoDockerd: true})
	o.MustExec(t, "ip", "route", "del", "default")
	return &policyLab{calicoHost: &calicoHost{Host: h, bin: bin, plugin: p}, outside: o}
}

// nft lists a table or chain of the calico host.
func (l *policyLab) nft(t *testing.T, args ...string) string {
	t.Helper()
	return l.MustExec(t, append([]string{"nft"}, args...)...)
}

func (l *policyLab) canPing(t *testing.T, from string, to net.IP) (bool, string) {
	t.Helper()
	out, err := l.Docker(t, "exec", from, "ping", "-c", "1", "-W", "1", to.String())
	return err == nil, out
}

// mustReach waits (briefly) for from to ping to.
func (l *policyLab) mustReach(t *testing.T, from string, to net.IP, what string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, what, func() error {
		if ok, out := l.canPing(t, from, to); !ok {
			return fmt.Errorf("%s cannot ping %s: %s", from, to, out)
		}
		return nil
	})
}

// mustNotReach: two pings, both unanswered.
func (l *policyLab) mustNotReach(t *testing.T, from string, to net.IP, what string) {
	t.Helper()
	for i := 0; i < 2; i++ {
		if ok, _ := l.canPing(t, from, to); ok {
			t.Errorf("%s: %s reaches %s", what, from, to)
			return
		}
	}
}

func (l *policyLab) endpointIfname(t *testing.T, container, network string) string {
	t.Helper()
	id := l.MustDocker(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).EndpointID}}`, network), container)
	if len(id) < 11 {
		t.Fatalf("container %s has no endpoint id on %s: %q", container, network, id)
	}
	return "cali" + id[:11]
}

func (l *policyLab) networkID(t *testing.T, name string) string {
	t.Helper()
	return l.MustDocker(t, "network", "inspect", "-f", "{{.Id}}", name)
}

// waitRules waits until the forward chain has the rules of every given
// interface: before that, fail-closed drops would make any "cannot reach"
// check pass for the wrong reason. The forward chain reaches an
// interface's rules through a jump on an interface-name set
// (oifname @ifs-...), so the interface has rules once it is an element of
// a set that such a jump names.
func (l *policyLab) waitRules(t *testing.T, ifnames ...string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "rules of "+strings.Join(ifnames, ", "), func() error {
		table := l.nft(t, "list", "table", "ip", policy.TableName)
		for _, i := range ifnames {
			if to, _ := forwardRulesFor(table, i); to == 0 {
				return fmt.Errorf("no rule for %s yet:\n%s", i, table)
			}
		}
		return nil
	})
}

var (
	forwardChainListing = regexp.MustCompile(`(?s)\tchain forward \{\n(.*?)\n\t\}`)
	ruleOnIfname        = regexp.MustCompile(`(iifname|oifname) (?:"([^"]+)"|@(\S+))`)
)

// forwardRulesFor counts the rules of the forward chain, in the listing of
// the project's table, that apply to the traffic to ifname and from it: a
// rule names the interface (oifname "x") or matches on an interface-name
// set that holds it (oifname @ifs-...). Negated matches (!= @workloads)
// and wildcards do not count.
func forwardRulesFor(table, ifname string) (to, from int) {
	fwd := forwardChainListing.FindStringSubmatch(table)
	if fwd == nil {
		return 0, 0
	}
	for _, rule := range strings.Split(fwd[1], "\n") {
		for _, m := range ruleOnIfname.FindAllStringSubmatch(rule, -1) {
			applies := m[2] == ifname
			if m[3] != "" {
				set := regexp.MustCompile(`(?s)\tset ` + regexp.QuoteMeta(m[3]) + ` \{\n(.*?)\n\t\}`).FindStringSubmatch(table)
				applies = set != nil && strings.Contains(set[1], `"`+ifname+`"`)
			}
			switch {
			case applies && m[1] == "oifname":
				to++
			case applies:
				from++
			}
		}
	}
	return to, from
}

// counter reads the packet counter of the rule with the given comment.
func counter(t *testing.T, listing, comment string) int {
	t.Helper()
	m := regexp.MustCompile(`counter packets (\d+) bytes \d+ \S+(?: \S+)? comment "` + regexp.QuoteMeta(comment) + `"`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no rule with comment %q in\n%s", comment, listing)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// tcpPeers lists the remote addresses of the established TCP connections
// to local port port in the output of `ss -Htn state established` or
// busybox `netstat -tn`: the field after the local address.
func tcpPeers(out string, port int) []string {
	var peers []string
	suffix := fmt.Sprintf(":%d", port)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "LISTEN") || strings.Contains(line, "TIME_WAIT") || strings.Contains(line, "SYN_") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if strings.HasSuffix(f[i], suffix) {
				if ip := hostOf(f[i+1]); ip != nil {
					peers = append(peers, ip.String())
				}
				break
			}
		}
	}
	return peers
}

// hostOf parses the address of "addr:port", "[addr]:port" or busybox's
// "::ffff:a.b.c.d:port" (a v4 peer of a dual-stack socket), as IPv4 when
// it is one.
func hostOf(s string) net.IP {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return nil
	}
	ip := net.ParseIP(strings.Trim(s[:i], "[]"))
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// TestOutgoingNAT: a container on a natOutgoing pool reaches a host that
// has no route back to the pool, which sees the calico host's address as
// the source; traffic between containers keeps the containers' addresses;
// a pool without natOutgoing is not masqueraded.
func TestOutgoingNAT(t *testing.T) {
	t.Parallel()
	l := newPolicyLab(t)
	d := func(args ...string) string { return l.MustDocker(t, args...) }
	d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "natnet")
	out, err := l.cli(t, "pool", "list", "-o", "json")
	if err != nil {
		t.Fatalf("pool list: %v\n%s", err, out)
	}
	var pools []ipam.Pool
	if err := json.Unmarshal([]byte(out), &pools); err != nil || len(pools) != 1 || pools[0].CIDR != ipam.DefaultPoolIPv4 || !pools[0].NATOutgoing {
		t.Fatalf("want only the default pool %s with natOutgoing; pool list: %s (%v)", ipam.DefaultPoolIPv4, out, err)
	}
	d("run", "-d", "--name", "c1", "--net", "natnet", harness.Image, "sleep", "3600")
	d("run", "-d", "--name", "c2", "--net", "natnet", harness.Image, "sleep", "3600")
	ip1, ip2 := l.containerIP(t, "c1", "natnet"), l.containerIP(t, "c2", "natnet")
	l.waitRules(t, l.endpointIfname(t, "c1", "natnet"), l.endpointIfname(t, "c2", "natnet"))

	if route, err := l.outside.Exec(t, "ip", "route", "get", ip1.String()); err == nil {
		t.Fatalf("the outside host has a route to the container %s: %s", ip1, route)
	}

	t.Run("container reaches the outside host, masqueraded", func(t *testing.T) {
		l.mustReach(t, "c1", l.outside.IP, "c1 pings the outside host")
		// The receiving side: an established TCP connection whose peer is
		// the calico host, not the container.
		// Both ends keep their stdin open: busybox nc closes the connection
		// when its stdin ends.
		l.outside.StartProcess(t, "nc-listen", nil, nil, "/bin/busybox", "sh", "-c", "/bin/busybox sleep 120 | /bin/busybox nc -l -p 7777")
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "nc listening on the outside host", func() error {
			if out, _ := l.outside.Exec(t, "ss", "-Hltn", "sport = :7777"); !strings.Contains(out, "7777") {
				return fmt.Errorf("not yet: %q", out)
			}
			return nil
		})
		d("exec", "-d", "c1", "sh", "-c", fmt.Sprintf("sleep 60 | nc %s 7777", l.outside.IP))
		var peers []string
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "connection at the outside host", func() error {
			out, _ := l.outside.Exec(t, "ss", "-Htn", "state", "established", "sport = :7777")
			if peers = tcpPeers(out, 7777); len(peers) == 0 {
				return fmt.Errorf("no established connection yet: %q", out)
			}
			return nil
		})
		if len(peers) != 1 || peers[0] != l.IP.String() {
			t.Errorf("the outside host sees the connection from %v, want the calico host %s (container c1 is %s)", peers, l.IP, ip1)
		}
		if n := counter(t, l.nft(t, "list", "chain", "ip", policy.TableName, "postrouting"), "natOutgoing: pool to outside the pools"); n == 0 {
			t.Errorf("the masquerade rule counted no packet")
		}
	})

	t.Run("container to container keeps its source", func(t *testing.T) {
		d("exec", "-d", "c2", "sh", "-c", "sleep 120 | nc -l -p 7778")
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "nc listening in c2", func() error {
			if out, _ := l.Docker(t, "exec", "c2", "netstat", "-ltn"); !strings.Contains(out, ":7778") {
				return fmt.Errorf("not yet: %q", out)
			}
			return nil
		})
		d("exec", "-d", "c1", "sh", "-c", fmt.Sprintf("sleep 60 | nc %s 7778", ip2))
		var peers []string
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "connection in c2", func() error {
			out, _ := l.Docker(t, "exec", "c2", "netstat", "-tn")
			if peers = tcpPeers(out, 7778); len(peers) == 0 {
				return fmt.Errorf("no established connection yet: %q", out)
			}
			return nil
		})
		if len(peers) != 1 || peers[0] != ip1.String() {
			t.Errorf("c2 sees the connection from %v, want c1's own address %s", peers, ip1)
		}
	})

	t.Run("pool without natOutgoing is not masqueraded", func(t *testing.T) {
		if out, err := l.cli(t, "pool", "add", "10.66.0.0/16"); err != nil {
			t.Fatalf("pool add: %v\n%s", err, out)
		}
		d("network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "10.66.0.0/16", "nonat")
		d("run", "-d", "--name", "c3", "--net", "nonat", harness.Image, "sleep", "3600")
		l.waitRules(t, l.endpointIfname(t, "c3", "nonat"))
		before := inEchos(t, l.outside)
		l.mustNotReach(t, "c3", l.outside.IP, "c3 (pool without natOutgoing) pings the outside host")
		// The requests did arrive (with the container's own address, to
		// which the outside host has no route): only the answer is missing.
		if after := inEchos(t, l.outside); after <= before {
			t.Errorf("the outside host received no echo request from c3 (%d -> %d): the failure is not about NAT", before, after)
		}
	})
}

// inEchos is the host's count of received ICMP echo requests.
func inEchos(t *testing.T, h *harness.Host) int {
	t.Helper()
	out := h.MustExec(t, "cat", "/proc/net/snmp")
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "Icmp: ") {
			continue
		}
		f := strings.Fields(line)[1:]
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "InEchos" && i < len(f) {
				v, _ := strconv.Atoi(f[i])
				return v
			}
		}
	}
	t.Fatalf("no Icmp InEchos in /proc/net/snmp:\n%s", out)
	return 0
}

// TestNetworkIsolation: containers of one network reach each other, of
// two different networks do not, unless both have isolation off; after a
// container leaves, nothing of it is left in the rules.
func TestNetworkIsolation(t *testing.T) {
	t.Parallel()
	l := newPolicyLab(t)
	d := func(args ...string) string { return l.MustDocker(t, args...) }
	create := func(name string, opts ...string) {
		d(append(append([]string{"network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam"}, opts...), name)...)
	}
	create("net1")
	create("net2")
	create("open1", "-o", "calico.isolation=off")
	create("open2", "-o", "calico.isolation=off")
	runOn := map[string]string{"a1": "net1", "a2": "net1", "b1": "net2", "b2": "net2", "o1": "open1", "o2": "open2"}
	ips := map[string]net.IP{}
	var ifnames []string
	for _, c := range []string{"a1", "a2", "b1", "b2", "o1", "o2"} {
		d("run", "-d", "--name", c, "--net", runOn[c], harness.Image, "sleep", "3600")
		ips[c] = l.containerIP(t, c, runOn[c])
		ifnames = append(ifnames, l.endpointIfname(t, c, runOn[c]))
	}
	l.waitRules(t, ifnames...)

	// The setup this runs on, as in production: Docker's FORWARD policy
	// drops and the dataplane's cali accepts are in DOCKER-USER; our drops
	// must hold all the same.
	if fwd := l.nft(t, "list", "chain", "ip", "filter", "FORWARD"); !strings.Contains(fwd, "policy drop") {
		t.Fatalf("Docker's FORWARD chain does not drop by default; the test would not show the interplay:\n%s", fwd)
	}
	if du := l.nft(t, "list", "chain", "ip", "filter", "DOCKER-USER"); !strings.Contains(du, `iifname "cali*"`) {
		t.Fatalf("DOCKER-USER has no cali accept:\n%s", du)
	}

	t.Run("same network", func(t *testing.T) {
		l.mustReach(t, "a1", ips["a2"], "a1 -> a2 (net1)")
		l.mustReach(t, "a2", ips["a1"], "a2 -> a1 (net1)")
		l.mustReach(t, "b1", ips["b2"], "b1 -> b2 (net2)")
		// The rules of a new container are in place before its process
		// runs: its very first packet gets through (fail closed must not
		// mean "fail at start").
		if out, err := l.Docker(t, "run", "--rm", "--net", "net1", harness.Image, "ping", "-c", "1", "-W", "2", ips["a1"].String()); err != nil {
			t.Errorf("a new container's first ping to a1 failed: %v\n%s", err, out)
		}
	})
	t.Run("different networks", func(t *testing.T) {
		egress := policy.EgressChainName(l.networkID(t, "net1"))
		before := counter(t, l.nft(t, "list", "chain", "ip", policy.TableName, egress), "to other calico networks")
		l.mustNotReach(t, "a1", ips["b1"], "a1 (net1) -> b1 (net2)")
		l.mustNotReach(t, "b1", ips["a1"], "b1 (net2) -> a1 (net1)")
		// Dropped by the isolation rule, not lost otherwise.
		if after := counter(t, l.nft(t, "list", "chain", "ip", policy.TableName, egress), "to other calico networks"); after <= before {
			t.Errorf("net1's isolation drop counted nothing (%d -> %d)", before, after)
		}
	})
	t.Run("isolation off", func(t *testing.T) {
		l.mustReach(t, "o1", ips["o2"], "o1 -> o2 (both isolation off)")
		l.mustReach(t, "o2", ips["o1"], "o2 -> o1 (both isolation off)")
		l.mustNotReach(t, "a1", ips["o1"], "a1 (net1, isolated) -> o1 (open1)")
		l.mustNotReach(t, "o1", ips["a1"], "o1 (open1) -> a1 (net1, isolated)")
	})
	t.Run("own host", func(t *testing.T) {
		if out, err := l.Exec(t, "ping", "-c", "1", "-W", "2", ips["a1"].String()); err != nil {
			t.Errorf("the host cannot ping its container a1: %v\n%s", err, out)
		}
		l.mustReach(t, "a1", l.IP, "a1 -> its own host")
	})
	t.Run("network names recorded", func(t *testing.T) {
		// The identity across hosts is the Docker network name, which the
		// daemon records in the network records.
		harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "names in the datastore", func() error {
			out, err := l.cli(t, "network", "list")
			if err != nil {
				return err
			}
			for _, n := range []string{"net1", "net2", "open1", "open2"} {
				if !regexp.MustCompile(`(?m)\s` + n + `\s`).MatchString(out) {
					return fmt.Errorf("%s not named yet:\n%s", n, out)
				}
			}
			return nil
		})
	})
	t.Run("leave removes the endpoint's rules", func(t *testing.T) {
		gone, goneIP := ifnames[1], ips["a2"].String()
		d("rm", "-f", "a2")
		harness.Eventually(t, 10*time.Second, 100*time.Millisecond, "a2's rules gone", func() error {
			all := l.nft(t, "list", "table", "ip", policy.TableName)
			if strings.Contains(all, gone) || regexp.MustCompile(`\b`+regexp.QuoteMeta(goneIP)+`\b`).MatchString(all) {
				return fmt.Errorf("still mentions %s or %s", gone, goneIP)
			}
			return nil
		})
		// Exactly two rules per remaining local endpoint, one for the
		// endpoints of isolation-off networks.
		all := l.nft(t, "list", "table", "ip", policy.TableName)
		for c, i := range map[string]string{"a1": ifnames[0], "b1": ifnames[2], "b2": ifnames[3], "o1": ifnames[4], "o2": ifnames[5]} {
			want := 2
			if strings.HasPrefix(c, "o") {
				want = 1
			}
			if to, from := forwardRulesFor(all, i); to+from != want {
				t.Errorf("%s (%s) has %d rules (%d to it, %d from it), want %d:\n%s", c, i, to+from, to, from, want, all)
			}
		}
		l.mustReach(t, "a1", l.IP, "a1 still works")
	})
}

// TestNetworkIsolationAcrossHosts: with BGP routing between two hosts that
// share a datastore, the networks called net1 on both hosts (two Docker
// networks, two ids) are one network; net2 is another; the cluster's hosts
// reach the containers, a host outside the cluster does not.
func TestNetworkIsolationAcrossHosts(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	a, b := c.addHost(t, "a"), c.addHost(t, "b") // both with net1
	for _, h := range []*bgpHost{a, b} {
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", mhPool, "net2")
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", mhPool, "-o", "calico.isolation=off", "open")
	}
	runOn := func(h *bgpHost, name, network string) net.IP {
		h.MustDocker(t, "run", "-d", "--name", name, "--net", network, harness.Image, "sleep", "3600")
		ip := net.ParseIP(h.MustDocker(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, network), name))
		if ip == nil {
			t.Fatalf("%s: container %s has no address on %s", h.Name, name, network)
		}
		return ip
	}
	a1, b1 := a.run(t, "a1"), b.run(t, "b1")
	a2, b2 := runOn(a, "a2", "net2"), runOn(b, "b2", "net2")
	ao, bo := runOn(a, "ao", "open"), runOn(b, "bo", "open")
	a.waitRoute(t, blockOf26(b1), b.IP, true, 30*time.Second)
	b.waitRoute(t, blockOf26(a1), a.IP, true, 30*time.Second)

	notPing := func(h *bgpHost, from string, to net.IP, what string) {
		t.Helper()
		for i := 0; i < 2; i++ {
			if out, err := h.Docker(t, "exec", from, "ping", "-c", "1", "-W", "1", to.String()); err == nil {
				t.Errorf("%s: %s reaches %s: %s", what, from, to, out)
				return
			}
		}
	}
	t.Run("same network on two hosts", func(t *testing.T) {
		a.ping(t, "a1", b1)
		b.ping(t, "b1", a1)
		a.ping(t, "a2", b2)
		b.ping(t, "b2", a2)
		a.ping(t, "ao", bo)
		b.ping(t, "bo", ao)
	})
	t.Run("different networks on two hosts", func(t *testing.T) {
		notPing(a, "a1", b2, "net1 on a -> net2 on b")
		notPing(b, "b2", a1, "net2 on b -> net1 on a")
		notPing(a, "a1", bo, "net1 on a -> open on b")
		notPing(b, "bo", a1, "open on b -> net1 on a")
	})
	t.Run("hosts", func(t *testing.T) {
		if out, err := b.Exec(t, "ping", "-c", "1", "-W", "2", a1.String()); err != nil {
			t.Errorf("host b (a cluster node) cannot ping a1 on host a: %v\n%s", err, out)
		}
		outsider := c.fabric.AddHost(t, "outsider", harness.HostOptions{NoDockerd: true})
		outsider.MustExec(t, "ip", "route", "add", mhPool, "via", a.IP.String())
		ingress := policy.IngressChainName(a.MustDocker(t, "network", "inspect", "-f", "{{.Id}}", mhNetwork))
		dropped := func() int {
			return counter(t, a.MustExec(t, "nft", "list", "chain", "ip", policy.TableName, ingress), "from outside the pools (ingress cluster)")
		}
		before := dropped()
		if out, err := outsider.Exec(t, "ping", "-c", "2", "-W", "1", a1.String()); err == nil {
			t.Errorf("a host outside the cluster reaches a1 (ingress is cluster by default): %s", out)
		}
		if after := dropped(); after <= before {
			t.Errorf("the outsider's pings were not dropped by net1's ingress rule (%d -> %d)", before, after)
		}
	})
}
