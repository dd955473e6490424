package e2e

import "testing"

// TestForwardRulesFor reads the project's table as nft lists it: a rule of
// the forward chain applies to an interface when it names it or matches on
// an interface-name set that holds it, and not when only another chain, a
// negated match or a set no forward rule names holds it. No root: the
// listing is text.
func TestForwardRulesFor(t *testing.T) {
	t.Parallel()
	const table = `table ip calico-cnm {
	set workloads {
		type ifname
		elements = { "cali6f2ada83cf4", "cali1c6484e8b75",
			     "cali00000000003" }
	}
	set ifs-a1e2c26e7a3e {
		type ifname
		elements = { "cali6f2ada83cf4",
			     "cali1c6484e8b75" }
	}
	set ifs-e7cb6cb980bd {
		type ifname
		elements = { "cali00000000002" }
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		oifname "cali*" oifname != @workloads counter packets 0 bytes 0 drop comment "to a workload interface without rules"
		iifname @ifs-e7cb6cb980bd counter packets 0 bytes 0 jump out-b6fdb710dc6b comment "from the endpoints of network natnet"
		oifname @ifs-a1e2c26e7a3e counter packets 0 bytes 0 jump in-b6fdb710dc6b comment "to the endpoints of network natnet"
		oifname "cali00000000004" counter packets 0 bytes 0 drop comment "selected by a policy"
	}
	chain in-b6fdb710dc6b {
		oifname "cali00000000005" accept
	}
}
`
	for _, tc := range []struct {
		ifname   string
		to, from int
	}{
		{"cali6f2ada83cf4", 1, 0},
		{"cali1c6484e8b75", 1, 0},
		{"cali00000000004", 1, 0}, // named by a rule of its own
		{"cali00000000002", 0, 1}, // in the set of a "from" jump
		{"cali00000000003", 0, 0}, // only in the workloads set
		{"cali00000000005", 0, 0}, // only in another chain
		{"cali6f2ada83cf", 0, 0},  // a prefix of a member
	} {
		if to, from := forwardRulesFor(table, tc.ifname); to != tc.to || from != tc.from {
			t.Errorf("forwardRulesFor(%s) = %d to, %d from; want %d, %d", tc.ifname, to, from, tc.to, tc.from)
		}
	}
	if to, from := forwardRulesFor("table ip calico-cnm {\n}\n", "cali6f2ada83cf4"); to+from != 0 {
		t.Errorf("a table without a forward chain has rules")
	}
}
