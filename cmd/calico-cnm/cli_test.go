package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// result is what one CLI invocation printed and returned.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %s\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// cliRun calls run() as main does, with env as the only environment: the
// tests must not depend on the ETCD_* variables of whoever runs them.
func cliRun(env map[string]string, args ...string) result {
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run(args, &out, &errOut, func(k string) string { return env[k] })
	return result{code: code, stdout: out.String(), stderr: errOut.String(), took: time.Since(start)}
}

// step is one CLI invocation and what it must produce. Empty expectations
// are not checked, except that stderr must be empty on success and one
// "calico-cnm: ..." line on failure.
type step struct {
	name   string
	args   []string
	code   int
	stdout string // exact, unless it starts with "~": then a regexp
	stderr string // substring of the single error line
	// before, when set, prepares the datastore for this step.
	before func(t *testing.T)
	// check, when set, looks at the result (and the datastore) further.
	check func(t *testing.T, r result)
}

func runSteps(t *testing.T, env map[string]string, steps []step) {
	t.Helper()
	for _, s := range steps {
		ok := t.Run(s.name, func(t *testing.T) {
			if s.before != nil {
				s.before(t)
			}
			r := cliRun(env, s.args...)
			if r.code != s.code {
				t.Fatalf("calico-cnm %s: want exit %d, got %s", strings.Join(s.args, " "), s.code, r)
			}
			if s.stdout != "" {
				if re, isRE := strings.CutPrefix(s.stdout, "~"); isRE {
					if !regexp.MustCompile(re).MatchString(r.stdout) {
						t.Errorf("stdout does not match %s:\n%s", re, r.stdout)
					}
				} else if r.stdout != s.stdout {
					t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, s.stdout)
				}
			}
			checkStderr(t, r, s.stderr)
			if s.check != nil {
				s.check(t, r)
			}
		})
		if !ok {
			// Later steps build on this one.
			t.FailNow()
		}
	}
}

// checkStderr: a failure starts with one line "calico-cnm: <sentence>"
// (usage errors add a line naming the command's --help); a success prints
// nothing on stderr.
func checkStderr(t *testing.T, r result, want string) {
	t.Helper()
	switch {
	case r.code == exitOK:
		if r.stderr != "" && want == "" {
			t.Errorf("success printed on stderr:\n%s", r.stderr)
		}
	default:
		first, _, _ := strings.Cut(r.stderr, "\n")
		if !strings.HasPrefix(first, "calico-cnm: ") {
			t.Errorf("error output does not start with \"calico-cnm: \":\n%s", r.stderr)
		}
		if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
			t.Errorf("error output looks like a crash:\n%s", r.stderr)
		}
	}
	if want != "" && !strings.Contains(r.stderr, want) {
		t.Errorf("stderr does not contain %q:\n%s", want, r.stderr)
	}
}

// withEtcd appends the member's endpoint flag: flags may follow the
// positional arguments, as users type them.
func withEtcd(ep string, args ...string) []string {
	return append(args, "--etcd-endpoints", ep)
}

// quietLog keeps the fixtures' IPAM logging out of the test output.
func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func startEtcd(t *testing.T) (*etcdtest.Member, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an embedded etcd member")
	}
	m := etcdtest.Start(t)
	return m, m.Config.EmbeddedClientURL
}

// startWithEmptyList starts etcd and checks that `<noun> list` of the
// empty datastore prints only header, and [] with -o json.
func startWithEmptyList(t *testing.T, noun, header string) (*datastore.Store, string) {
	t.Helper()
	m, ep := startEtcd(t)
	runSteps(t, nil, []step{
		{name: "empty", args: withEtcd(ep, noun, "list"), stdout: header},
		{name: "empty json", args: withEtcd(ep, noun, "list", "-o", "json"), stdout: "[]\n"},
	})
	return m.Client(t), ep
}

// TestCLIUsage covers what needs no datastore: help, version and every
// malformed command line (exit 2 with one sentence, without trying to
// connect: no endpoint is configured that could answer).
func TestCLIUsage(t *testing.T) {
	// An endpoint nobody listens on: a command line that got as far as
	// connecting would fail with exit 1, not 2.
	env := map[string]string{"ETCD_ENDPOINTS": fmt.Sprintf("http://127.0.0.1:%d", etcdtest.DeadPort(t))}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"no arguments", nil, exitUsage, "", "Usage:"},
		{"help", []string{"help"}, exitOK, "Available Commands:", ""},
		{"--help", []string{"--help"}, exitOK, "Usage:", ""},
		{"-h", []string{"-h"}, exitOK, "Usage:", ""},
		{"version", []string{"version"}, exitOK, "calico-cnm " + Version + "\n", ""},
		{"--version", []string{"--version"}, exitOK, "calico-cnm " + Version + "\n", ""},
		{"unknown command", []string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{"pool without subcommand", []string{"pool"}, exitUsage, "", "pool needs a subcommand"},
		{"unknown pool subcommand", []string{"pool", "resize", "10.0.0.0/16"}, exitUsage, "", `unknown pool subcommand "resize"`},
		{"pool add without CIDR", []string{"pool", "add"}, exitUsage, "", "needs exactly one CIDR"},
		{"pool add two CIDRs", []string{"pool", "add", "10.0.0.0/16", "10.1.0.0/16"}, exitUsage, "", "needs exactly one CIDR"},
		{"pool add bad CIDR", []string{"pool", "add", "10.0.0.0"}, exitUsage, "", `"10.0.0.0" is not a CIDR`},
		{"pool add prefix too long", []string{"pool", "add", "10.0.0.0/33"}, exitUsage, "", "is not a CIDR"},
		{"pool delete bad CIDR", []string{"pool", "delete", "tenten"}, exitUsage, "", `"tenten" is not a CIDR`},
		{"pool disable without CIDR", []string{"pool", "disable"}, exitUsage, "", "needs exactly one CIDR"},
		{"pool enable bad CIDR", []string{"pool", "enable", "fd00::/129"}, exitUsage, "", "is not a CIDR"},
		{"pool list with argument", []string{"pool", "list", "10.0.0.0/16"}, exitUsage, "", "pool list takes no arguments"},
		{"pool unknown flag", []string{"pool", "list", "--colour"}, exitUsage, "", "unknown flag: --colour"},
		{"pool bad block size value", []string{"pool", "add", "10.0.0.0/16", "--block-size", "big"}, exitUsage, "", `invalid argument "big"`},
		{"pool -h", []string{"pool", "list", "-h"}, exitOK, "--etcd-endpoints", ""},
		{"bad output format", []string{"pool", "list", "-o", "xml"}, exitUsage, "", `invalid argument "xml" for "-o, --output" flag: use table, wide, json, yaml`},
		{"ipam without subcommand", []string{"ipam"}, exitUsage, "", "ipam needs a subcommand"},
		{"unknown ipam subcommand", []string{"ipam", "leak"}, exitUsage, "", `unknown ipam subcommand "leak"`},
		{"ipam show with argument", []string{"ipam", "show", "10.0.0.1"}, exitUsage, "", `ipam show takes no arguments, got ["10.0.0.1"]`},
		{"ipam release without --ip", []string{"ipam", "release"}, exitUsage, "", "needs --ip with a valid address"},
		{"ipam release bad --ip", []string{"ipam", "release", "--ip", "10.0.0.300"}, exitUsage, "", `got "10.0.0.300"`},
		{"ipam release CIDR as --ip", []string{"ipam", "release", "--ip", "10.0.0.1/32"}, exitUsage, "", "needs --ip with a valid address"},
		{"ipam check bad timeout", []string{"ipam", "check", "--timeout", "soon"}, exitUsage, "", `invalid argument "soon"`},
		{"network without subcommand", []string{"network"}, exitUsage, "", "network needs a subcommand: bandwidth, list or ports"},
		{"network unknown subcommand", []string{"network", "rm", "x"}, exitUsage, "", `unknown network subcommand "rm": use bandwidth, list or ports`},
		{"network list with argument", []string{"network", "list", "net1"}, exitUsage, "", "network list takes no arguments"},
		{"node without subcommand", []string{"node"}, exitUsage, "", "node needs a subcommand: delete, list, rotate-key or status"},
		{"unknown node subcommand", []string{"node", "remove", "h1"}, exitUsage, "", `unknown node subcommand "remove"`},
		{"node delete without name", []string{"node", "delete"}, exitUsage, "", "node delete needs exactly one node name"},
		{"node delete two names", []string{"node", "delete", "h1", "h2"}, exitUsage, "", "node delete needs exactly one node name"},
		{"node list with argument", []string{"node", "list", "h1"}, exitUsage, "", "node list takes no arguments"},
		{"serve with argument", []string{"serve", "now"}, exitUsage, "", "serve takes no arguments"},
		{"serve unknown flag", []string{"serve", "--etcd", "x"}, exitUsage, "", "unknown flag: --etcd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := cliRun(env, c.args...)
			if r.code != c.code {
				t.Fatalf("want exit %d, got %s", c.code, r)
			}
			if !strings.Contains(r.stdout, c.stdout) {
				t.Errorf("stdout does not contain %q:\n%s", c.stdout, r.stdout)
			}
			if !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("stderr does not contain %q:\n%s", c.stderr, r.stderr)
			}
			if c.code == exitUsage {
				if c.args != nil && !strings.Contains(r.stderr, "calico-cnm: ") {
					t.Errorf("usage error without the \"calico-cnm: \" sentence:\n%s", r.stderr)
				}
				if r.stdout != "" {
					t.Errorf("usage error printed on stdout:\n%s", r.stdout)
				}
			}
		})
	}
}

// TestCLIPools walks the pool lifecycle against a real etcd member and checks
// every output, and that each command really changed the datastore.
func TestCLIPools(t *testing.T) {
	m, ep := startEtcd(t)
	eng := ipam.New(m.Client(t), ipam.Options{Log: quietLog()})
	ctx := context.Background()
	pool := func(t *testing.T, cidr string) ipam.Pool {
		t.Helper()
		p, err := eng.GetPool(ctx, cidr)
		if err != nil {
			t.Fatalf("pool %s in the datastore: %v", cidr, err)
		}
		return p
	}
	listJSON := func(t *testing.T, r result) []ipam.Pool {
		t.Helper()
		var ps []ipam.Pool
		if err := json.Unmarshal([]byte(r.stdout), &ps); err != nil {
			t.Fatalf("pool list -o json is not a JSON list of pools: %v\n%s", err, r.stdout)
		}
		return ps
	}
	header := "CIDR  BLOCK SIZE  NAT OUTGOING  DISABLED  VXLAN MODE\n"
	runSteps(t, nil, []step{
		{name: "list empty", args: withEtcd(ep, "pool", "list"), stdout: header},
		{name: "list empty json", args: withEtcd(ep, "pool", "list", "-o", "json"), stdout: "[]\n"},
		{name: "add", args: withEtcd(ep, "pool", "add", "10.10.0.0/16"),
			stdout: "pool 10.10.0.0/16 added (block size /26)\n",
			check: func(t *testing.T, _ result) {
				if p := pool(t, "10.10.0.0/16"); p.BlockSize != 26 || p.NATOutgoing || p.Disabled {
					t.Errorf("stored pool %+v, want /26 blocks, no NAT, enabled", p)
				}
			}},
		{name: "add with options", args: withEtcd(ep, "pool", "add", "10.20.0.0/24", "--block-size", "28", "--nat-outgoing"),
			stdout: "pool 10.20.0.0/24 added (block size /28)\n",
			check: func(t *testing.T, _ result) {
				if p := pool(t, "10.20.0.0/24"); p.BlockSize != 28 || !p.NATOutgoing {
					t.Errorf("stored pool %+v, want /28 blocks with NAT", p)
				}
			}},
		{name: "add IPv6 json", args: withEtcd(ep, "pool", "add", "-o", "json", "fd00:1::/64"),
			check: func(t *testing.T, r result) {
				var p ipam.Pool
				if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
					t.Fatalf("pool add -o json: %v\n%s", err, r.stdout)
				}
				if p.CIDR != "fd00:1::/64" || p.BlockSize != 122 {
					t.Errorf("pool add -o json printed %+v, want fd00:1::/64 with /122 blocks", p)
				}
			}},
		{name: "add disabled", args: withEtcd(ep, "pool", "add", "--disabled", "10.30.0.0/16"),
			stdout: "pool 10.30.0.0/16 added (block size /26)\n",
			check: func(t *testing.T, _ result) {
				if !pool(t, "10.30.0.0/16").Disabled {
					t.Error("pool added with --disabled is enabled")
				}
			}},
		{name: "add ipip refused", args: withEtcd(ep, "pool", "add", "10.50.0.0/16", "--ipip-mode", "Always"), code: exitUsage, stderr: "no IP-in-IP data path"},
		{name: "add bad vxlan mode", args: withEtcd(ep, "pool", "add", "10.50.0.0/16", "--vxlan-mode", "Sometimes"), code: exitUsage, stderr: "unknown vxlanMode"},
		{name: "add vxlan", args: withEtcd(ep, "pool", "add", "10.50.0.0/16", "--vxlan-mode", "CrossSubnet"),
			stdout: "pool 10.50.0.0/16 added (block size /26, vxlanMode CrossSubnet)\n"},
		{name: "set vxlan", args: withEtcd(ep, "pool", "set", "10.50.0.0/16", "--vxlan-mode", "always"),
			stdout: "pool 10.50.0.0/16: vxlanMode Always\n",
			check: func(t *testing.T, _ result) {
				if p := pool(t, "10.50.0.0/16"); p.VXLANMode != ipam.EncapAlways {
					t.Errorf("stored pool %+v, want vxlanMode Always", p)
				}
			}},
		{name: "set without mode", args: withEtcd(ep, "pool", "set", "10.50.0.0/16"), code: exitUsage, stderr: "needs --vxlan-mode"},
		{name: "set unknown pool", args: withEtcd(ep, "pool", "set", "10.60.0.0/16", "--vxlan-mode", "Always"), code: exitFailed, stderr: "no IP pool 10.60.0.0/16"},
		{name: "set bad mode", args: withEtcd(ep, "pool", "set", "10.50.0.0/16", "--vxlan-mode", "x"), code: exitUsage, stderr: "unknown vxlanMode"},
		{name: "delete vxlan pool", args: withEtcd(ep, "pool", "delete", "10.50.0.0/16"), stdout: "pool 10.50.0.0/16 deleted\n"},
		{name: "add duplicate", args: withEtcd(ep, "pool", "add", "10.10.0.0/16"), code: exitFailed, stderr: "10.10.0.0/16"},
		{name: "add overlapping", args: withEtcd(ep, "pool", "add", "10.10.128.0/17"), code: exitFailed, stderr: "overlap"},
		{name: "add bad block size", args: withEtcd(ep, "pool", "add", "10.40.0.0/16", "--block-size", "12"), code: exitUsage, stderr: "block size"},
		{name: "add host bits set", args: withEtcd(ep, "pool", "add", "10.40.0.1/16"), code: exitUsage, stderr: "10.40.0.1/16"},
		{name: "list", args: withEtcd(ep, "pool", "list"),
			stdout: "CIDR          BLOCK SIZE  NAT OUTGOING  DISABLED  VXLAN MODE\n" +
				"10.10.0.0/16  /26         false         false     Never\n" +
				"10.20.0.0/24  /28         true          false     Never\n" +
				"10.30.0.0/16  /26         false         true      Never\n" +
				"fd00:1::/64   /122        false         false     Never\n"},
		{name: "list json", args: withEtcd(ep, "pool", "list", "-o", "json"),
			check: func(t *testing.T, r result) {
				got := map[string]ipam.Pool{}
				for _, p := range listJSON(t, r) {
					got[p.CIDR] = p
				}
				want := map[string]ipam.Pool{
					"10.10.0.0/16": {CIDR: "10.10.0.0/16", BlockSize: 26},
					"10.20.0.0/24": {CIDR: "10.20.0.0/24", BlockSize: 28, NATOutgoing: true},
					"10.30.0.0/16": {CIDR: "10.30.0.0/16", BlockSize: 26, Disabled: true},
					"fd00:1::/64":  {CIDR: "fd00:1::/64", BlockSize: 122},
				}
				if len(got) != len(want) {
					t.Errorf("pool list -o json has %d pools, want %d:\n%s", len(got), len(want), r.stdout)
				}
				for cidr, w := range want {
					if g := got[cidr]; g.CIDR != w.CIDR || g.BlockSize != w.BlockSize || g.NATOutgoing != w.NATOutgoing || g.Disabled != w.Disabled {
						t.Errorf("pool %s: got %+v, want %+v", cidr, g, w)
					}
				}
			}},
		{name: "disable", args: withEtcd(ep, "pool", "disable", "10.10.0.0/16"), stdout: "pool 10.10.0.0/16 disabled\n",
			check: func(t *testing.T, _ result) {
				if !pool(t, "10.10.0.0/16").Disabled {
					t.Error("pool still enabled in the datastore")
				}
			}},
		{name: "list shows disabled", args: withEtcd(ep, "pool", "list"), stdout: `~(?m)^10\.10\.0\.0/16\s+/26\s+false\s+true\s+Never$`},
		{name: "enable", args: withEtcd(ep, "pool", "enable", "10.10.0.0/16"), stdout: "pool 10.10.0.0/16 enabled\n",
			check: func(t *testing.T, _ result) {
				if pool(t, "10.10.0.0/16").Disabled {
					t.Error("pool still disabled in the datastore")
				}
			}},
		{name: "disable unknown pool", args: withEtcd(ep, "pool", "disable", "10.99.0.0/16"), code: exitFailed, stderr: "10.99.0.0/16"},
		{name: "delete", args: withEtcd(ep, "pool", "delete", "10.20.0.0/24"), stdout: "pool 10.20.0.0/24 deleted\n",
			check: func(t *testing.T, _ result) {
				if _, err := eng.GetPool(ctx, "10.20.0.0/24"); err == nil {
					t.Error("deleted pool is still in the datastore")
				}
			}},
		{name: "delete again", args: withEtcd(ep, "pool", "delete", "10.20.0.0/24"), code: exitFailed, stderr: "10.20.0.0/24"},
		{name: "delete pool in use", args: withEtcd(ep, "pool", "delete", "10.10.0.0/16"), code: exitFailed, stderr: "10.10.0.0/16",
			before: func(t *testing.T) {
				_, within, _ := net.ParseCIDR("10.10.0.0/16")
				if _, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: "cnm.inuse", Within: within}); err != nil {
					t.Fatalf("assigning an address: %v", err)
				}
			},
			check: func(t *testing.T, _ result) {
				pool(t, "10.10.0.0/16")
			}},
		{name: "list after delete", args: withEtcd(ep, "pool", "list"),
			stdout: "CIDR          BLOCK SIZE  NAT OUTGOING  DISABLED  VXLAN MODE\n" +
				"10.10.0.0/16  /26         false         false     Never\n" +
				"10.30.0.0/16  /26         false         true      Never\n" +
				"fd00:1::/64   /122        false         false     Never\n"},
	})
}

// ipamFixture is one pool with three addresses of host h1: two belong to
// endpoints the datastore records, the third (handle cnm.leaked) to none.
type ipamFixture struct {
	live   []net.IP
	leaked net.IP
}

func newIPAMFixture(t *testing.T, store *datastore.Store, eng *ipam.Engine) ipamFixture {
	t.Helper()
	ctx := context.Background()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.50.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	var f ipamFixture
	for i, h := range []string{"cnm.live1", "cnm.live2", "cnm.leaked"} {
		ip, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: h, Attrs: map[string]string{ipam.AttrNode: "h1"}})
		if err != nil {
			t.Fatal(err)
		}
		if h == "cnm.leaked" {
			f.leaked = ip.IP
			continue
		}
		f.live = append(f.live, ip.IP)
		id := fmt.Sprintf("ep%d%s", i, strings.Repeat("0", 60))
		ep := datastore.Endpoint{ID: id, Network: "net1id", Node: "h1", IPv4: ip.String(), MAC: "ee:ee:ee:ee:ee:ee", HostIfName: "cali" + id[:11]}
		b, _ := json.Marshal(ep)
		if err := store.Txn(ctx, datastore.Create(datastore.EndpointKey("h1", id), b)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func usage(t *testing.T, eng *ipam.Engine) map[string]ipam.BlockUsage {
	t.Helper()
	us, err := eng.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ipam.BlockUsage{}
	for _, u := range us {
		out[u.CIDR] = u
	}
	return out
}

// TestCLIIPAM: show, check (exit 3 while there are problems, --release
// fixes them, 0 afterwards) and release --ip.
func TestCLIIPAM(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	// Assigned long ago: only then can an address be a leak.
	eng := ipam.New(store, ipam.Options{Log: quietLog(), Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	f := newIPAMFixture(t, store, eng)
	// The leak is h1's, and h1's Docker knows none of the addresses.
	env := map[string]string{"NODENAME": "h1", "DOCKER_HOST": fakeDockerd(t)}
	// Hosts claim random free blocks; all three addresses are in h1's one.
	blockNet := net.IPNet{IP: f.leaked.Mask(net.CIDRMask(26, 32)), Mask: net.CIDRMask(26, 32)}
	block := blockNet.String()
	showRow := func(used int) string {
		return fmt.Sprintf(`~^BLOCK\s+POOL\s+HOST\s+USED\s+FREE\n%s\s+10\.50\.0\.0/16\s+h1\s+%d\s+%d\n$`, regexp.QuoteMeta(block), used, 64-used)
	}
	free := net.IP(append([]byte(nil), blockNet.IP.To4()...))
	free[3] += 60
	if u := usage(t, eng)[block]; u.Used != 3 || u.Host != "h1" {
		t.Fatalf("fixture: block %s usage %+v, want 3 used by h1", block, u)
	}
	checkClean := "leaked addresses:     0\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\n"
	runSteps(t, env, []step{
		{name: "show", args: withEtcd(ep, "ipam", "show"), stdout: showRow(3)},
		{name: "show json", args: withEtcd(ep, "ipam", "show", "-o", "json"),
			check: func(t *testing.T, r result) {
				var us []ipam.BlockUsage
				if err := json.Unmarshal([]byte(r.stdout), &us); err != nil {
					t.Fatalf("ipam show -o json: %v\n%s", err, r.stdout)
				}
				want := ipam.BlockUsage{CIDR: block, Pool: "10.50.0.0/16", Host: "h1", Size: 64, Used: 3}
				if len(us) != 1 || us[0] != want {
					t.Errorf("ipam show -o json = %+v, want [%+v]", us, want)
				}
			}},
		{name: "check finds the leak", args: withEtcd(ep, "ipam", "check"), code: exitProblem,
			stdout: "leaked addresses:     1\n  cnm.leaked\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\n",
			stderr: "1 problem(s) found",
			check: func(t *testing.T, _ result) {
				if u := usage(t, eng)[block]; u.Used != 3 {
					t.Errorf("check without --release changed the datastore: %+v", u)
				}
			}},
		{name: "check json", args: withEtcd(ep, "ipam", "check", "-o", "json"), code: exitProblem,
			check: func(t *testing.T, r result) {
				var rep ipam.Report
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
					t.Fatalf("ipam check -o json: %v\n%s", err, r.stdout)
				}
				if len(rep.LeakedHandles) != 1 || rep.LeakedHandles[0] != "cnm.leaked" || rep.Problems() != 1 {
					t.Errorf("ipam check -o json = %+v, want only the leaked handle cnm.leaked", rep)
				}
			}},
		{name: "check --release fixes", args: withEtcd(ep, "ipam", "check", "--release"),
			stdout: "leaked addresses:     1\n  cnm.leaked\norphaned handles:     0\nmissing affinities:   0\ndangling affinities:  0\nfixed 1 problem(s)\n",
			check: func(t *testing.T, _ result) {
				if u := usage(t, eng)[block]; u.Used != 2 {
					t.Errorf("after --release block %s has %d addresses used, want the 2 live ones", block, u.Used)
				}
				allocs, err := eng.Allocations(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range allocs {
					if a.IP.Equal(f.leaked) {
						t.Errorf("leaked address %s is still allocated (handle %s)", f.leaked, a.HandleID)
					}
				}
			}},
		{name: "check clean", args: withEtcd(ep, "ipam", "check"), stdout: checkClean},
		{name: "check clean json", args: withEtcd(ep, "ipam", "check", "-o", "json"),
			check: func(t *testing.T, r result) {
				var rep ipam.Report
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
					t.Fatalf("ipam check -o json: %v\n%s", err, r.stdout)
				}
				if rep.Problems() != 0 {
					t.Errorf("problems after the fix: %+v", rep)
				}
			}},
		{name: "release", args: withEtcd(ep, "ipam", "release", "--ip", f.live[1].String()),
			stdout: "released " + f.live[1].String() + " (handle cnm.live2)\n",
			check: func(t *testing.T, _ result) {
				if u := usage(t, eng)[block]; u.Used != 1 {
					t.Errorf("after release block %s has %d addresses used, want 1", block, u.Used)
				}
			}},
		{name: "show after release", args: withEtcd(ep, "ipam", "show"), stdout: showRow(1)},
		{name: "release again", args: withEtcd(ep, "ipam", "release", "--ip", f.live[1].String()), code: exitFailed,
			stderr: f.live[1].String() + " is not allocated: nothing to release"},
		// A free address the operator probably mistyped: say so, and leave
		// the block alone.
		{name: "release unallocated", args: withEtcd(ep, "ipam", "release", "--ip", free.String()), code: exitFailed,
			stderr: free.String() + " is not allocated",
			check: func(t *testing.T, _ result) {
				if u := usage(t, eng)[block]; u.Used != 1 {
					t.Errorf("releasing a free address changed the block: %+v", u)
				}
			}},
		{name: "release outside pools", args: withEtcd(ep, "ipam", "release", "--ip", "10.99.0.1"), code: exitFailed,
			stderr: "10.99.0.1 is not in any IP pool (pools: 10.50.0.0/16)"},
	})
}

// TestCLINetworkList lists the networks the datastore records with their
// endpoint counts.
func TestCLINetworkList(t *testing.T) {
	store, ep := startWithEmptyList(t, "network", "NETWORK ID  NAME  SUBNETS  POOLS  ENDPOINTS\n")
	ctx := context.Background()

	put := func(key string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Txn(ctx, datastore.Create(key, b)); err != nil {
			t.Fatal(err)
		}
	}
	id1 := "0123456789abcdef" + strings.Repeat("1", 48)
	id2 := "fedcba9876543210" + strings.Repeat("2", 48)
	put(datastore.NetworkKey(id1), datastore.Network{ID: id1, Name: "net1", Pools: []string{"192.168.0.0/16"}, Subnets: []string{"192.168.0.0/16"}})
	put(datastore.NetworkKey(id2), datastore.Network{ID: id2})
	for i, node := range []string{"h1", "h1", "h2"} {
		eid := fmt.Sprintf("e%d", i)
		put(datastore.EndpointKey(node, eid), datastore.Endpoint{ID: eid, Network: id1, Node: node, IPv4: fmt.Sprintf("192.168.0.%d/32", i+1)})
	}

	runSteps(t, nil, []step{
		{name: "table", args: withEtcd(ep, "network", "list"),
			stdout: "NETWORK ID    NAME  SUBNETS         POOLS           ENDPOINTS\n" +
				"0123456789ab  net1  192.168.0.0/16  192.168.0.0/16  3\n" +
				"fedcba987654  -     -               -               0\n"},
		{name: "json", args: withEtcd(ep, "network", "list", "-o", "json"),
			check: func(t *testing.T, r result) {
				var rows []struct {
					ID        string   `json:"id"`
					Name      string   `json:"name"`
					Pools     []string `json:"pools"`
					Endpoints int      `json:"endpoints"`
				}
				if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
					t.Fatalf("network list -o json: %v\n%s", err, r.stdout)
				}
				if len(rows) != 2 || rows[0].ID != id1 || rows[0].Name != "net1" || rows[0].Endpoints != 3 ||
					len(rows[0].Pools) != 1 || rows[1].ID != id2 || rows[1].Endpoints != 0 {
					t.Errorf("network list -o json = %+v", rows)
				}
			}},
	})
}

// TestCLINode: `node list` shows every node with its daemon's state and
// holdings; `node delete` refuses a running node and an unknown one, and
// removes a gone node's records and addresses.
func TestCLINode(t *testing.T) {
	store, ep := startWithEmptyList(t, "node", "NAME  DAEMON  BGP ADDRESS  ASN  BLOCKS  ADDRESSES  ENDPOINTS  VTEP  ROUTES\n")
	ctx := context.Background()

	eng := ipam.New(store, ipam.Options{Log: quietLog()})
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.80.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	ip, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h2", HandleID: "cnm.h2a", Attrs: map[string]string{"node": "h2"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []datastore.Node{{Name: "h1", IPv4: "172.20.0.1", ASN: 64512}, {Name: "h2", IPv4: "172.20.0.2", ASN: 64512, VXLANTunnelAddr: "10.9.0.1"}} {
		if err := store.Txn(ctx, datastore.Create(datastore.NodeKey(n.Name), datastore.MustJSON(n))); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Txn(ctx, datastore.Create(datastore.EndpointKey("h2", "e1"), datastore.MustJSON(datastore.Endpoint{ID: "e1", Node: "h2", IPv4: ip.String()}))); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go store.KeepAlive(kctx, datastore.Alive{Node: "h1", Hostname: "host-one", PID: 4242, Since: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, 10*time.Second, quietLog())
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a, _ := store.AliveNodes(ctx); len(a) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("h1 never marked alive")
		}
		time.Sleep(50 * time.Millisecond)
	}

	runSteps(t, nil, []step{
		{name: "list", args: withEtcd(ep, "node", "list", "--state-dir", t.TempDir()),
			stdout: "NAME  DAEMON                         BGP ADDRESS  ASN    BLOCKS  ADDRESSES  ENDPOINTS  VTEP      ROUTES\n" +
				"h1    up since 2026-01-02T03:04:05Z  172.20.0.1   64512  0       0          0          -         -\n" +
				"h2    down                           172.20.0.2   64512  1       1          1          10.9.0.1  -\n"},
		{name: "delete a running node", args: withEtcd(ep, "node", "delete", "h1"), code: exitFailed,
			stderr: "node h1's daemon (pid 4242 on host-one, up since 2026-01-02T03:04:05Z) holds its liveness lease; stop it first"},
		{name: "delete an unknown node", args: withEtcd(ep, "node", "delete", "h3"), code: exitFailed,
			stderr: `node is not known to the datastore: "h3"`},
		{name: "delete a gone node", args: withEtcd(ep, "node", "delete", "h2"),
			stdout: "deleted node h2: 1 endpoint records, 1 addresses released, 1 blocks released, 0 blocks kept without affinity (other hosts' workloads borrow from them), 0 node-scoped BGP peers\n",
			check: func(t *testing.T, r result) {
				if got := usage(t, eng); len(got) != 0 {
					t.Errorf("blocks after node delete: %+v", got)
				}
				if _, err := store.Get(ctx, datastore.NodeKey("h2")); !errors.Is(err, datastore.ErrNotFound) {
					t.Errorf("node record of h2 after delete: %v", err)
				}
			}},
		{name: "list json", args: withEtcd(ep, "node", "list", "-o", "json"),
			check: func(t *testing.T, r result) {
				var rows []struct {
					Name       string
					Alive      bool
					BGPAddress string
				}
				if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
					t.Fatalf("node list -o json: %v\n%s", err, r.stdout)
				}
				if len(rows) != 1 || rows[0].Name != "h1" || !rows[0].Alive || rows[0].BGPAddress != "172.20.0.1" {
					t.Errorf("node list -o json = %+v", rows)
				}
			}},
	})
}

// TestCLIBGPPeer: passwords come from a file, an environment variable or a
// secret reference, never from the command line, and no output shows them;
// a secret reference keeps the password out of the datastore.
func TestCLIBGPPeer(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	ctx := context.Background()
	pwFile := t.TempDir() + "/pw"
	if err := os.WriteFile(pwFile, []byte("file-Secret\nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOR_PW": "env-Secret"}
	record := func(t *testing.T, name string) datastore.BGPPeer {
		t.Helper()
		var p datastore.BGPPeer
		if _, err := store.GetJSON(ctx, datastore.BGPPeerKey(name), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noSecrets := func(t *testing.T, r result) {
		t.Helper()
		for _, s := range []string{"file-Secret", "env-Secret"} {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("output shows a password:\n%s", r)
			}
		}
	}
	runSteps(t, env, []step{
		{name: "from a file", args: withEtcd(ep, "bgp", "peer", "add", "p1", "--peer-ip", "10.9.0.1", "--as-number", "65001", "--password-file", pwFile),
			stdout: "BGP peer p1 added: 10.9.0.1 AS 65001, for every node, with a TCP MD5 password\n",
			check: func(t *testing.T, r result) {
				if p := record(t, "p1"); p.Password != "file-Secret" || p.PasswordSecret != "" {
					t.Errorf("record = %+v", p)
				}
			}},
		{name: "from the environment", args: withEtcd(ep, "bgp", "peer", "add", "p2", "--peer-ip", "10.9.0.2", "--as-number", "65002", "--node", "h1", "--password-env", "TOR_PW"),
			stdout: "BGP peer p2 added: 10.9.0.2 AS 65002, for node h1, with a TCP MD5 password\n",
			check: func(t *testing.T, r result) {
				if p := record(t, "p2"); p.Password != "env-Secret" {
					t.Errorf("record = %+v", p)
				}
			}},
		{name: "a secret reference", args: withEtcd(ep, "bgp", "peer", "add", "p3", "--peer-ip", "10.9.0.3", "--as-number", "65003", "--password-secret", "tor-key"),
			stdout: "BGP peer p3 added: 10.9.0.3 AS 65003, for every node, with the TCP MD5 password of secret tor-key\n",
			check: func(t *testing.T, r result) {
				if p := record(t, "p3"); p.Password != "" || p.PasswordSecret != "tor-key" {
					t.Errorf("record = %+v", p)
				}
			}},
		{name: "secret and file", args: withEtcd(ep, "bgp", "peer", "add", "p4", "--peer-ip", "10.9.0.4", "--as-number", "65004", "--password-secret", "k", "--password-file", pwFile),
			code: exitUsage, stderr: "use --password-secret, or --password-file/--password-env, not both"},
		{name: "secret with a path", args: withEtcd(ep, "bgp", "peer", "add", "p4", "--peer-ip", "10.9.0.4", "--as-number", "65004", "--password-secret", "../etc/shadow"),
			code: exitUsage, stderr: "secret name \"../etc/shadow\""},
		{name: "secret dot dot", args: withEtcd(ep, "bgp", "peer", "add", "p4", "--peer-ip", "10.9.0.4", "--as-number", "65004", "--password-secret", ".."),
			code: exitUsage, stderr: "name a file in the secrets directory"},
		{name: "unset environment variable", args: withEtcd(ep, "bgp", "peer", "add", "p4", "--peer-ip", "10.9.0.4", "--as-number", "65004", "--password-env", "NOPE"),
			code: exitUsage, stderr: "environment variable NOPE is empty or unset"},
		{name: "list", args: withEtcd(ep, "bgp", "peer", "list"),
			stdout: "NAME  PEER IP   AS     NODE      PASSWORD\n" +
				"p1    10.9.0.1  65001  (global)  yes\n" +
				"p2    10.9.0.2  65002  h1        yes\n" +
				"p3    10.9.0.3  65003  (global)  secret tor-key\n",
			check: noSecrets},
		{name: "list json", args: withEtcd(ep, "bgp", "peer", "list", "-o", "json"),
			check: func(t *testing.T, r result) {
				noSecrets(t, r)
				if !strings.Contains(r.stdout, `"passwordSecret": "tor-key"`) {
					t.Errorf("json lacks the secret's name:\n%s", r.stdout)
				}
			}},
		{name: "delete", args: withEtcd(ep, "bgp", "peer", "delete", "p3"), stdout: "BGP peer p3 deleted\n"},
	})
	if p, err := store.Get(ctx, datastore.BGPPeerKey("p4")); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("a rejected add wrote %+v (%v)", p, err)
	}
}

// TestCLIEnvEndpoints: without --etcd-endpoints the CLI uses ETCD_ENDPOINTS.
func TestCLIEnvEndpoints(t *testing.T) {
	_, ep := startEtcd(t)
	env := map[string]string{"ETCD_ENDPOINTS": ep}
	runSteps(t, env, []step{
		{name: "add", args: []string{"pool", "add", "10.60.0.0/16"}, stdout: "pool 10.60.0.0/16 added (block size /26)\n"},
		{name: "list", args: []string{"pool", "list"}, stdout: `~(?m)^10\.60\.0\.0/16\s+/26\s+false\s+false\s+Never$`},
	})
}

// TestCLIUnreachableEtcd: every datastore command fails with exit 1 and one
// sentence, within about --timeout, when nothing answers.
func TestCLIUnreachableEtcd(t *testing.T) {
	dead := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.DeadPort(t))
	for _, args := range [][]string{
		{"pool", "list"},
		{"pool", "add", "10.70.0.0/16"},
		{"pool", "delete", "10.70.0.0/16"},
		{"pool", "disable", "10.70.0.0/16"},
		{"ipam", "show"},
		{"ipam", "check"},
		{"ipam", "check", "--release"},
		{"ipam", "release", "--ip", "10.70.0.1"},
		{"network", "list"},
		{"node", "list"},
		{"node", "delete", "h1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel() // each waits out its timeout
			r := cliRun(nil, append(args, "--etcd-endpoints", dead, "--timeout", "1s")...)
			if r.code != exitFailed {
				t.Fatalf("want exit 1, got %s", r)
			}
			if r.stdout != "" {
				t.Errorf("stdout should be empty:\n%s", r.stdout)
			}
			if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); len(lines) != 1 {
				t.Errorf("want one line on stderr, got %d:\n%s", len(lines), r.stderr)
			}
			if !strings.HasPrefix(r.stderr, "calico-cnm: ") || !strings.Contains(r.stderr, "unreachable") {
				t.Errorf("stderr is not one sentence saying etcd is unreachable:\n%s", r.stderr)
			}
			if r.took > 5*time.Second {
				t.Errorf("took %s with --timeout 1s", r.took)
			}
		})
	}
}
