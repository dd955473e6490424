package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// requireNetns skips, loudly, where throw-away namespaces cannot be made.
func requireNetns(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("!!!!!! SKIPPED under -short (make unit): this nftables integration test creates a network namespace; run `go test ./policy/` as root. The kernel side is NOT verified !!!!!!")
	}
	if os.Geteuid() != 0 {
		t.Skip("!!!!!! SKIPPED: this nftables integration test needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for a throw-away network namespace; run `go test ./policy/` as root. The kernel side is NOT verified !!!!!!")
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("!!!!!! SKIPPED: %s is not installed (iproute2, nftables; see scripts/install-deps.sh). The kernel side is NOT verified !!!!!!", bin)
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newNetns makes a namespace that the test deletes when it ends.
func newNetns(t testing.TB, prefix string) string {
	t.Helper()
	name := prefix + randHex(4)
	mustRun(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("deleting netns %s: %v: %s", name, err, out)
		}
	})
	mustRun(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

func mustRun(t testing.TB, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// nftIn runs the nft binary in the namespace: an independent reader of
// what the netlink code wrote.
func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	return mustRun(t, append([]string{"ip", "netns", "exec", ns, "nft"}, args...)...)
}

// openNFT is the policy's nftables writer in the namespace ns, closed
// when the test ends.
func openNFT(t *testing.T, ns string) *NFT {
	t.Helper()
	n, err := NewNFT("/var/run/netns/"+ns, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func testLog(t *testing.T) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	l.SetLevel(logrus.DebugLevel)
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// decoys are other people's tables, including one of our name in another
// family and an iptables-nft style filter table like Docker's.
const decoys = `
table ip decoy {
	set addrs { type ipv4_addr; elements = { 192.168.0.1 } }
	chain fwd1 { type filter hook forward priority 0; policy accept; iifname "cali*" counter accept; }
}
table inet calico-cnm {
	chain fwd1 { type filter hook forward priority 0; policy accept; }
}
table ip6 decoy6 {
	chain post { type nat hook postrouting priority 100; policy accept; }
}
table ip filter {
	chain FORWARD { type filter hook forward priority 0; policy drop; jump DOCKER-USER; }
	chain DOCKER-USER { iifname "cali*" accept; oifname "cali*" accept; }
}
`

var decoyTables = [][]string{{"ip", "decoy"}, {"inet", "calico-cnm"}, {"ip6", "decoy6"}, {"ip", "filter"}}

func listDecoys(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range decoyTables {
		b.WriteString(nftIn(t, ns, "-s", "list", "table", d[0], d[1]))
	}
	return b.String()
}

// checkInSync dumps the tables and requires them to equal want exactly.
func checkInSync(t *testing.T, n *NFT, want Ruleset) {
	t.Helper()
	got, err := n.Dump(context.Background(), IPv4, IPv6)
	if err != nil {
		t.Fatal(err)
	}
	if ops := Diff(got, want); len(ops) != 0 {
		t.Fatalf("kernel differs from the desired tables; plan:\n%s\nkernel:\n%s", strings.Join(opStrings(ops), "\n"), got.Render())
	}
	if len(got.Tables) != len(want.Tables) {
		t.Fatalf("kernel has %d of our tables, want %d", len(got.Tables), len(want.Tables))
	}
	// What Apply remembers is the kernel's tables, handles included (the
	// kernel's echo of each new rule).
	if known, ok := n.Known(); ok {
		if k, g := byHandle(known), byHandle(got); !maps.Equal(k, g) {
			t.Fatalf("remembered rules differ from the kernel's:\nremembered: %v\nkernel:     %v", k, g)
		}
		if ops := Diff(known, got); len(ops) != 0 {
			t.Fatalf("remembered sets or chains differ from the kernel's:\n%s", strings.Join(opStrings(ops), "\n"))
		}
	}
}

// byHandle is every rule of rs by family and handle.
func byHandle(rs Ruleset) map[string]string {
	out := map[string]string{}
	for _, tb := range rs.Tables {
		for _, c := range tb.Chains {
			for _, r := range c.Rules {
				out[fmt.Sprintf("%s/%d", tb.Family, r.Handle)] = c.Name + ": " + r.Render(tb.Family)
			}
		}
	}
	return out
}

// TestNFTApplyIntegration writes, changes and deletes the tables in a
// throw-away namespace: exactly what is desired, idempotent, endpoint
// rules added and removed one by one, repaired when tampered with, and no
// other table touched.
func TestNFTApplyIntegration(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	ns := newNetns(t, "cnmpol-")
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(decoys)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("creating decoy tables: %v\n%s", err, out)
	}
	before := listDecoys(t, ns)

	n := openNFT(t, ns)

	st := baseState()
	st.IPv6 = true
	st.Endpoints = append(st.Endpoints, ep(5, net1ID, "h1", "192.168.0.5", true))
	st.Endpoints[len(st.Endpoints)-1].IPv6 = "fd00:1::5/128"
	want := desired(t, st)

	changes, err := n.Apply(ctx, want)
	if err != nil {
		t.Fatalf("first apply: %v", err)
	}
	if changes == 0 {
		t.Fatal("first apply made no changes")
	}
	checkInSync(t, n, want)

	// An independent reader sees the rules and elements.
	listing := nftIn(t, ns, "list", "table", "ip", TableName)
	for _, s := range []string{
		`oifname @` + JumpSetName(api.Ingress, IngressChainName(net1ID)) + ` counter packets 0 bytes 0 jump ` + IngressChainName(net1ID),
		`iifname @` + JumpSetName(api.Egress, EgressChainName(net1ID)) + ` counter packets 0 bytes 0 jump ` + EgressChainName(net1ID),
		ifOf(epID(0)),
		`ip saddr @nat-pools ip daddr != @pools counter packets 0 bytes 0 masquerade`,
		`type nat hook postrouting priority srcnat; policy accept;`,
		`type filter hook forward priority filter; policy accept;`,
		`192.168.0.0/16`,
		`ct state established,related counter`,
		`iifname "cali*" iifname != @workloads counter packets 0 bytes 0 drop`,
	} {
		if !strings.Contains(listing, s) {
			t.Errorf("nft list lacks %q:\n%s", s, listing)
		}
	}
	listing6 := nftIn(t, ns, "list", "table", "ip6", TableName)
	if !strings.Contains(listing6, "fd00:1::5") || !strings.Contains(listing6, "ip6 saddr @nat-pools ip6 daddr != @pools") {
		t.Errorf("ip6 table lacks the member fd00:1::5 or the masquerade:\n%s", listing6)
	}

	// Idempotent.
	if changes, err := n.Apply(ctx, want); err != nil || changes != 0 {
		t.Fatalf("second apply: %d changes, %v; want none", changes, err)
	}

	// Join: only the new endpoint's rules and elements are added.
	joined := ep(7, net1ID, "h1", "192.168.0.7", true)
	st2 := st
	st2.Endpoints = append(slices.Clone(st.Endpoints), joined)
	want2 := desired(t, st2)
	handlesBefore := ruleHandles(t, n)
	// Per family: the elements of net1's two interface sets and of
	// workloads (+ the net1 member element in ip); no rule.
	applyChanges(t, n, want2, "join", 7)
	handlesAfter := ruleHandles(t, n)
	for h, r := range handlesBefore {
		if handlesAfter[h] != r {
			t.Errorf("join replaced rule %d (%s): the other rules must stay as they are", h, r)
		}
	}

	// Leave: nothing of the endpoint is left, the rest untouched.
	applyChanges(t, n, want, "leave", 7)
	all := nftIn(t, ns, "list", "ruleset")
	for _, s := range []string{joined.HostIfName, "192.168.0.7"} {
		if strings.Contains(all, s) {
			t.Errorf("after leave the ruleset still mentions %s:\n%s", s, all)
		}
	}
	if got := ruleHandles(t, n); !mapsEqual(got, handlesBefore) {
		t.Errorf("after join+leave the rules differ from before")
	}

	// Somebody deletes one of our rules and adds one. Apply trusts what
	// it programmed last (it does not read the kernel at every change);
	// the periodic resync (Resync, then Apply) repairs it.
	h := findHandle(t, ns, "ip", "forward", "oifname @"+JumpSetName(api.Ingress, IngressChainName(net1ID)))
	nftIn(t, ns, "delete", "rule", "ip", TableName, "forward", "handle", h)
	nftIn(t, ns, "add", "rule", "ip", TableName, "forward", "ip", "saddr", "1.2.3.4", "accept")
	if changes, err := n.Apply(ctx, want); err != nil || changes != 0 {
		t.Errorf("apply without a resync: %d changes, %v; want none (the kernel is not read)", changes, err)
	}
	n.Resync()
	if changes, err := n.Apply(ctx, want); err != nil || changes != 2 {
		t.Errorf("repair: %d changes, %v; want 2 (add the missing rule, delete the foreign one)", changes, err)
	}
	checkInSync(t, n, want)

	// The whole table deleted by hand, then a join: the batch planned
	// from what Apply remembers fails, so it reads the kernel and
	// rebuilds the table.
	nftIn(t, ns, "delete", "table", "ip", TableName)
	if _, err := n.Apply(ctx, want2); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want2)

	// Deleted by hand again: the resync rebuilds it.
	nftIn(t, ns, "delete", "table", "ip", TableName)
	n.Resync()
	if _, err := n.Apply(ctx, want); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want)

	// IPv6 off: the ip6 table goes.
	st.IPv6 = false
	want4 := desired(t, st)
	if _, err := n.Apply(ctx, want4); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want4)

	if err := n.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := n.Dump(ctx, IPv4, IPv6); err != nil || len(got.Tables) != 0 {
		t.Errorf("after Delete: %v, %v", got.Render(), err)
	}
	if after := listDecoys(t, ns); after != before {
		t.Errorf("other tables changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// applyChanges applies want (the step named what) and requires exactly
// wantChanges changes and the kernel in step afterwards.
func applyChanges(t *testing.T, n *NFT, want Ruleset, what string, wantChanges int) {
	t.Helper()
	changes, err := n.Apply(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if changes != wantChanges {
		t.Errorf("%s made %d changes, want %d", what, changes, wantChanges)
	}
	checkInSync(t, n, want)
}

func ruleHandles(t *testing.T, n *NFT) map[uint64]string {
	t.Helper()
	rs, err := n.Dump(context.Background(), IPv4, IPv6)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, tb := range rs.Tables {
		for _, c := range tb.Chains {
			for _, r := range c.Rules {
				out[r.Handle] = string(tb.Family) + " " + c.Name + " " + r.Render(tb.Family)
			}
		}
	}
	return out
}

func mapsEqual(a, b map[uint64]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// findHandle is the handle (nft -a) of the first rule in chain mentioning s.
func findHandle(t *testing.T, ns, family, chain, s string) string {
	t.Helper()
	out := nftIn(t, ns, "-a", "list", "chain", family, TableName, chain)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, s) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				return strings.TrimSpace(line[i+len("# handle "):])
			}
		}
	}
	t.Fatalf("no rule mentioning %s in chain %s:\n%s", s, chain, out)
	return ""
}

// TestNFTLargeBatch: a host with many containers: the first write is one
// large batch (the socket buffers must hold all its acknowledgements), and
// a single leave afterwards is a handful of changes, not a rewrite.
func TestNFTLargeBatch(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	ns := newNetns(t, "cnmpol-")
	n := openNFT(t, ns)
	st := baseState()
	st.IPv6 = true
	const count = 1500
	for i := 0; i < count; i++ {
		id := fmt.Sprintf("%011x%053d", 0xc0ffee000+i, 0)
		st.Endpoints = append(st.Endpoints, localEP(id, []string{net1ID, net2ID}[i%2], fmt.Sprintf("192.168.%d.%d", 8+i/250, 1+i%250)))
	}
	want := desired(t, st)
	start := time.Now()
	changes, err := n.Apply(ctx, want)
	if err != nil {
		t.Fatalf("applying %d endpoints: %v", count, err)
	}
	t.Logf("%d local endpoints: %d changes in %s", count, changes, time.Since(start))
	checkInSync(t, n, want)

	st.Endpoints = st.Endpoints[:len(st.Endpoints)-1]
	want2 := desired(t, st)
	start = time.Now()
	changes, err = n.Apply(ctx, want2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one leave among %d: %d changes in %s", count, changes, time.Since(start))
	if changes > 8 {
		t.Errorf("one leave made %d changes: the tables were rewritten instead of updated", changes)
	}
	checkInSync(t, n, want2)
}

// localEP is a joined endpoint of this host (h1).
func localEP(id, network, ip string) datastore.Endpoint {
	return datastore.Endpoint{ID: id, Network: network, Node: "h1", IPv4: ip + "/32", HostIfName: ifOf(id), Joined: true}
}

// TestNFTPolicyProgram writes the policy program (marks, ports, ICMP,
// log, goto, selector and nets sets) to the kernel, reads it back equal,
// and removes it again without a rewrite.
func TestNFTPolicyProgram(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	ns := newNetns(t, "cnmpolp-")
	n := openNFT(t, ns)
	st := policyState(t)
	acts, err := api.Decode(strings.NewReader(`apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: acts}
spec:
  selector: has(role)
  egress:
  - action: Log
  - action: Pass
    protocol: UDP
    destination: {ports: [53, "50:60"], notPorts: ["55:56"]}
  - action: Allow
    protocol: ICMP
    icmp: {type: 8, code: 0}
    destination: {nets: [10.0.0.0/8], notNets: [10.1.0.0/16]}
  - action: Deny
    notProtocol: TCP
    destination: {notSelector: "role == 'db'"}
  - action: Allow
    protocol: TCP
    source: {ports: [7]}
`))
	if err != nil {
		t.Fatal(err)
	}
	st.Policies = append(st.Policies, acts...)
	st.IPv6 = true
	want := mustDesired(t, st)
	if _, err := n.Apply(ctx, want); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want)
	if changes, err := n.Apply(ctx, want); err != nil || changes != 0 {
		t.Fatalf("second apply: %d changes, %v", changes, err)
	}
	listing := nftIn(t, ns, "list", "table", "ip", TableName)
	for _, s := range []string{"log prefix \"calico-cnm acts \"", "udp dport 50-60", "goto in-", "icmp type echo-request"} {
		if !strings.Contains(listing, s) {
			t.Errorf("nft list lacks %q:\n%s", s, listing)
		}
	}
	// Deleting the policies: exactly their chains and sets go, in place.
	without := mustDesired(t, baseState())
	cur, err := n.Dump(ctx, IPv4, IPv6)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Execute(ctx, Diff(cur, without)); err != nil {
		t.Fatalf("in-place removal of the policy program: %v", err)
	}
	checkInSync(t, n, without)
}

// TestCalculatorApplyFollowsKernel: random changes through the
// Calculator, each Ruleset applied to a throw-away namespace's kernel by
// NFT, which plans against what it applied last (nft.DiffFrom) and keeps
// the kernel's state without reading it back (appending added rules in
// place, taking the Ruleset's set elements): after every change the
// kernel holds exactly the Ruleset, and what NFT remembers is the kernel's.
func TestCalculatorApplyFollowsKernel(t *testing.T) {
	requireNetns(t)
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			ns := newNetns(t, "cnmpk-")
			n, err := NewNFT("/var/run/netns/"+ns, quiet())
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			g, s, ss := startCalcGen(t, seed)
			for burst := 0; burst < 40; burst++ {
				g.burst(s, ss)
				want, _ := ss.calculator(s).CompleteDeferredWork()
				if _, err := n.Apply(context.Background(), want); err != nil {
					t.Fatalf("burst %d: %v", burst, err)
				}
				checkInSync(t, n, want)
			}
		})
	}
}
