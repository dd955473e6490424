package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/calico-cnm/calico-cnm/ipam"
)

// TestCLIIPAMConfigure: without flags the settings are shown; each flag
// changes its setting only; bad values are usage errors that write
// nothing.
func TestCLIIPAMConfigure(t *testing.T) {
	m, ep := startEtcd(t)
	eng := ipam.New(m.Client(t), ipam.Options{Log: quietLog()})
	stored := func(want ipam.Config) func(t *testing.T, _ result) {
		return func(t *testing.T, _ result) {
			t.Helper()
			if got, err := eng.GetConfig(context.Background()); err != nil || got != want {
				t.Errorf("stored config %+v, %v; want %+v", got, err, want)
			}
		}
	}
	runSteps(t, nil, []step{
		{name: "show the defaults", args: withEtcd(ep, "ipam", "configure"),
			stdout: "strictAffinity:      false\nautoAllocateBlocks:  true\nmaxBlocksPerHost:    unlimited\n",
			check:  stored(ipam.DefaultConfig())},
		{name: "strict affinity", args: withEtcd(ep, "ipam", "configure", "--strict-affinity=true"),
			stdout: "IPAM configuration updated\nstrictAffinity:      true\nautoAllocateBlocks:  true\nmaxBlocksPerHost:    unlimited\n",
			check:  stored(ipam.Config{StrictAffinity: true, AutoAllocateBlocks: true})},
		{name: "limit and auto allocation", args: withEtcd(ep, "ipam", "configure", "--max-blocks-per-host", "4", "--auto-allocate-blocks=false"),
			stdout: "IPAM configuration updated\nstrictAffinity:      true\nautoAllocateBlocks:  false\nmaxBlocksPerHost:    4\n",
			check:  stored(ipam.Config{StrictAffinity: true, MaxBlocksPerHost: 4})},
		{name: "json", args: withEtcd(ep, "ipam", "configure", "-o", "json"),
			check: func(t *testing.T, r result) {
				var c ipam.Config
				if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c != (ipam.Config{StrictAffinity: true, MaxBlocksPerHost: 4}) {
					t.Errorf("ipam configure -o json = %+v, %v:\n%s", c, err, r.stdout)
				}
			}},
		{name: "negative limit", args: withEtcd(ep, "ipam", "configure", "--max-blocks-per-host", "-1", "--strict-affinity=false"),
			code: exitUsage, stderr: "--max-blocks-per-host -1: use 0 (unlimited) or a positive number",
			check: stored(ipam.Config{StrictAffinity: true, MaxBlocksPerHost: 4})},
		{name: "not a boolean", args: withEtcd(ep, "ipam", "configure", "--strict-affinity=maybe"),
			code: exitUsage, stderr: `invalid argument "maybe"`},
		{name: "back to unlimited", args: withEtcd(ep, "ipam", "configure", "--max-blocks-per-host", "0", "--auto-allocate-blocks=true", "--strict-affinity=false"),
			check: stored(ipam.DefaultConfig())},
	})
}
