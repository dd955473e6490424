package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/ipam"
)

func TestDesiredVXLANFilter(t *testing.T) {
	for _, c := range []struct {
		mode  string
		rules []string
	}{
		{mode: "", rules: nil},
		{mode: "Never", rules: nil},
		{mode: "Always", rules: []string{
			`meta l4proto 17 th dport 4789 ip saddr @hosts counter accept comment "VXLAN from a cluster node"`,
			`meta l4proto 17 th dport 4789 counter drop comment "VXLAN from a non-node address"`,
		}},
		{mode: "CrossSubnet", rules: []string{
			`meta l4proto 17 th dport 4789 ip saddr @hosts counter accept comment "VXLAN from a cluster node"`,
			`meta l4proto 17 th dport 4789 counter drop comment "VXLAN from a non-node address"`,
		}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			st := baseState()
			st.IPv6 = true
			st.Pools = append(st.Pools, ipam.Pool{CIDR: "10.77.0.0/16", VXLANMode: c.mode})
			rs, _ := Desired(st)
			v4 := mustTable(t, rs, IPv4)
			var got []string
			for _, ch := range v4.Chains {
				if ch.Name != ChainVXLAN {
					continue
				}
				if ch.Base == nil || ch.Base.Hook != "input" || ch.Base.Type != "filter" {
					t.Errorf("chain %s is not an input filter: %+v", ch.Name, ch.Base)
				}
				for _, r := range ch.Rules {
					got = append(got, r.Render(IPv4))
				}
			}
			if strings.Join(got, "\n") != strings.Join(c.rules, "\n") {
				t.Errorf("vxlan-input rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.rules, "\n"))
			}
			for _, ch := range mustTable(t, rs, IPv6).Chains {
				if ch.Name == ChainVXLAN {
					t.Error("a VXLAN filter in the ip6 table (VXLAN is IPv4 only)")
				}
			}
		})
	}
}

// TestNFTVXLANFilterIntegration writes the filter in a throw-away namespace
// and sends it VXLAN packets from a node address and from another one: the
// first is accepted, the second dropped, and the counters say so.
func TestNFTVXLANFilterIntegration(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	rx := newNetns(t, "cnmvx-")
	tx := newNetns(t, "cnmvx-")
	veth := "cnmvx" + randHex(3)
	mustRun(t, "ip", "link", "add", veth, "netns", rx, "type", "veth", "peer", "name", "eth0", "netns", tx)
	mustRun(t, "ip", "-n", rx, "addr", "add", "10.99.0.1/24", "dev", veth)
	mustRun(t, "ip", "-n", rx, "link", "set", veth, "up")
	mustRun(t, "ip", "-n", tx, "addr", "add", "10.99.0.2/24", "dev", "eth0")
	mustRun(t, "ip", "-n", tx, "addr", "add", "10.99.0.3/24", "dev", "eth0")
	mustRun(t, "ip", "-n", tx, "link", "set", "eth0", "up")

	n := openNFT(t, rx)
	st := baseState()
	st.Pools = append(st.Pools, ipam.Pool{CIDR: "10.77.0.0/16", VXLANMode: "Always"})
	st.Nodes[0].IPv4 = "10.99.0.2" // a node; 10.99.0.3 is not
	want := desired(t, st)
	if _, err := n.Apply(ctx, want); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want)

	send := func(src string) {
		t.Helper()
		mustRun(t, "ip", "-n", tx, "route", "replace", "10.99.0.1/32", "dev", "eth0", "src", src)
		mustRun(t, "ip", "netns", "exec", tx, "bash", "-c", "echo vxlan > /dev/udp/10.99.0.1/4789")
	}
	waitCounters := func(accepted, dropped uint64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := n.RuleCounters(IPv4, ChainVXLAN)
			if err != nil {
				t.Fatal(err)
			}
			if got["VXLAN from a cluster node"] == accepted && got["VXLAN from a non-node address"] == dropped {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("counters %v, want %d accepted and %d dropped\n%s", got, accepted, dropped, nftIn(t, rx, "list", "chain", "ip", TableName, ChainVXLAN))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	send("10.99.0.2")
	waitCounters(1, 0)
	send("10.99.0.3")
	send("10.99.0.3")
	waitCounters(1, 2)
	listing := nftIn(t, rx, "list", "chain", "ip", TableName, ChainVXLAN)
	if !strings.Contains(listing, fmt.Sprintf("udp dport %d counter packets 2", VXLANPort)) {
		t.Errorf("nft list does not show the drop counter:\n%s", listing)
	}
}
