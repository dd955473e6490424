package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// testTree is the command tree as run() builds it.
func testTree() *cobra.Command {
	return newRootCmd(&app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
}

// commandPaths lists every user-facing command as its argument path
// ("pool add"), the root as "".
func commandPaths(root *cobra.Command) [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		out = append(out, path)
		for _, s := range c.Commands() {
			walk(s, append(append([]string(nil), path...), s.Name()))
		}
	}
	walk(root, nil)
	return out
}

func findCmd(t *testing.T, root *cobra.Command, path []string) *cobra.Command {
	t.Helper()
	c, rest, err := root.Find(path)
	if err != nil || len(rest) != 0 {
		t.Fatalf("command %q: %v (left %q)", path, err, rest)
	}
	return c
}

// TestCLIHelpEveryCommand: every command answers -h and --help on stdout
// with exit 0, a description, an example and its flags.
func TestCLIHelpEveryCommand(t *testing.T) {
	root := testTree()
	paths := commandPaths(root)
	if len(paths) < 20 {
		t.Fatalf("the tree has only %d commands: %q", len(paths), paths)
	}
	for _, path := range paths {
		c := findCmd(t, root, path)
		for _, h := range []string{"--help", "-h"} {
			t.Run(strings.Join(append(path, h), " "), func(t *testing.T) {
				if c.Short == "" || c.Example == "" {
					t.Errorf("%q lacks a short description or an example", c.CommandPath())
				}
				r := cliRun(nil, append(append([]string(nil), path...), h)...)
				if r.code != exitOK || r.stderr != "" {
					t.Fatalf("want exit 0 and nothing on stderr, got %s", r)
				}
				for _, want := range []string{c.Short, "Usage:", "Examples:", strings.TrimSpace(strings.SplitN(c.Example, "\n", 2)[0])} {
					if c.Long != "" && want == c.Short {
						want = strings.SplitN(c.Long, "\n", 2)[0]
					}
					if !strings.Contains(r.stdout, want) {
						t.Errorf("help lacks %q:\n%s", want, r.stdout)
					}
				}
				c.LocalFlags().VisitAll(func(f *pflag.Flag) {
					if !strings.Contains(r.stdout, "--"+f.Name) {
						t.Errorf("help does not list --%s:\n%s", f.Name, r.stdout)
					}
				})
			})
		}
	}
}

// TestCLIMisplacedFlags: every command refuses, with exit 2, each flag that
// belongs to another command (and did nothing there in the old CLI).
func TestCLIMisplacedFlags(t *testing.T) {
	root := testTree()
	all := map[string]bool{}
	for _, path := range commandPaths(root) {
		findCmd(t, root, path).LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { all[f.Name] = true })
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	tried := 0
	for _, path := range commandPaths(root) {
		c := findCmd(t, root, path)
		for _, name := range names {
			if c.Flags().Lookup(name) != nil {
				continue
			}
			tried++
			args := append(append([]string(nil), path...), "--"+name+"=1")
			r := cliRun(nil, args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "unknown flag: --"+name) || r.stdout != "" {
				t.Errorf("calico-cnm %s: want exit 2 and \"unknown flag: --%s\", got %s", strings.Join(args, " "), name, r)
			}
		}
	}
	// The two the issue names, as typed there.
	for _, args := range [][]string{
		{"pool", "delete", "10.0.0.0/16", "--nat-outgoing"},
		{"ipam", "show", "--ip", "1.2.3.4"},
	} {
		if r := cliRun(nil, args...); r.code != exitUsage || !strings.Contains(r.stderr, "unknown flag") {
			t.Errorf("calico-cnm %s: want exit 2 (unknown flag), got %s", strings.Join(args, " "), r)
		}
	}
	if tried < 100 {
		t.Errorf("only %d misplaced flags tried", tried)
	}
}

// TestCLICompletion: each shell's script is generated, and the scripts'
// callback completes command names and -o values.
func TestCLICompletion(t *testing.T) {
	for shell, marker := range map[string]string{
		"bash": "complete -o default -F __start_calico-cnm calico-cnm",
		"zsh":  "#compdef calico-cnm",
		"fish": "complete -c calico-cnm",
	} {
		t.Run(shell, func(t *testing.T) {
			r := cliRun(nil, "completion", shell)
			if r.code != exitOK || !strings.Contains(r.stdout, marker) {
				t.Fatalf("completion %s: want exit 0 and %q, got exit %d, stderr %q, %d bytes", shell, marker, r.code, r.stderr, len(r.stdout))
			}
			if _, err := exec.LookPath(shell); err != nil || shell == "fish" {
				return // no syntax check possible for this shell here
			}
			cmd := exec.Command(shell, "-n")
			cmd.Stdin = strings.NewReader(r.stdout)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s -n on the script: %v\n%s", shell, err, out)
			}
		})
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", "po"}, []string{"pool\t"}},
		{[]string{"__complete", "pool", ""}, []string{"add\t", "delete\t", "disable\t", "enable\t", "list\t"}},
		{[]string{"__complete", "ipam", "show", "-o", ""}, []string{"table\n", "wide\n", "json\n", "yaml\n"}},
	} {
		r := cliRun(nil, c.args...)
		for _, w := range c.want {
			if r.code != exitOK || !strings.Contains(r.stdout, w) {
				t.Errorf("calico-cnm %s: want %q in the candidates, got %s", strings.Join(c.args, " "), w, r)
			}
		}
	}
}

// TestCLIOutputFormats: every listing prints the same data as JSON and as
// YAML, both parse, and -o wide adds columns to -o table.
func TestCLIOutputFormats(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	ctx := context.Background()
	eng := ipam.New(store, ipam.Options{Log: quietLog()})
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.90.0.0/16", NATOutgoing: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: "cnm.a"}); err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("ab", 32)
	for key, v := range map[string]any{
		datastore.NetworkKey(id):    datastore.Network{ID: id, Name: "n1", Pools: []string{"10.90.0.0/16"}},
		datastore.NodeKey("h1"):     datastore.Node{Name: "h1", IPv4: "172.20.0.1"},
		datastore.BGPPeerKey("tor"): datastore.BGPPeer{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, Password: "Secret-PW"},
	} {
		if err := store.Txn(ctx, datastore.Create(key, datastore.MustJSON(v))); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		wide string // a header only -o wide shows
		code int
	}{
		{[]string{"pool", "list"}, "BLOCKS", exitOK},
		{[]string{"ipam", "show"}, "SIZE", exitOK},
		{[]string{"network", "list"}, "GATEWAYS", exitOK},
		{[]string{"node", "list"}, "IPV6 NEXT HOP", exitOK},
		{[]string{"bgp", "peer", "list"}, "", exitOK},
		{[]string{"bgp", "config"}, "", exitOK},
		{[]string{"ipam", "check"}, "", exitProblem}, // the address has no endpoint
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			outputs := map[string]result{}
			for _, f := range outputFormats {
				r := cliRun(nil, withEtcd(ep, append(c.args, "-o", f)...)...)
				if r.code != c.code {
					t.Fatalf("-o %s: want exit %d, got %s", f, c.code, r)
				}
				if strings.Contains(r.stdout, "Secret-PW") {
					t.Errorf("-o %s shows the peer's password:\n%s", f, r.stdout)
				}
				outputs[f] = r
			}
			var fromJSON, fromYAML any
			if err := json.Unmarshal([]byte(outputs[formatJSON].stdout), &fromJSON); err != nil {
				t.Fatalf("-o json does not parse: %v\n%s", err, outputs[formatJSON].stdout)
			}
			j, err := yaml.YAMLToJSON([]byte(outputs[formatYAML].stdout))
			if err != nil {
				t.Fatalf("-o yaml does not parse: %v\n%s", err, outputs[formatYAML].stdout)
			}
			if err := json.Unmarshal(j, &fromYAML); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(fromJSON) != fmt.Sprint(fromYAML) || bytes.Equal(j, []byte("null")) {
				t.Errorf("-o yaml and -o json differ:\n%s\n%s", outputs[formatYAML].stdout, outputs[formatJSON].stdout)
			}
			if c.wide != "" {
				if strings.Contains(outputs[formatTable].stdout, c.wide) || !strings.Contains(outputs[formatWide].stdout, c.wide) {
					t.Errorf("want %q only in -o wide:\ntable:\n%s\nwide:\n%s", c.wide, outputs[formatTable].stdout, outputs[formatWide].stdout)
				}
			}
		})
	}
	if r := cliRun(nil, withEtcd(ep, "network", "list", "-o", "wide")...); !strings.Contains(r.stdout, id) {
		t.Errorf("network list -o wide does not show the full network ID:\n%s", r)
	}
	// TAB after a command that names a record completes the names in the
	// datastore.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pool", "delete"}, "10.90.0.0/16\n"},
		{[]string{"pool", "disable"}, "10.90.0.0/16\n"},
		{[]string{"node", "delete"}, "h1\n"},
		{[]string{"bgp", "peer", "delete"}, "tor\n"},
	} {
		args := append(append([]string{"__complete"}, c.args...), "--etcd-endpoints", ep, "")
		if r := cliRun(nil, args...); r.code != exitOK || !strings.HasPrefix(r.stdout, c.want) {
			t.Errorf("calico-cnm %s: want the candidate %q, got %s", strings.Join(args, " "), c.want, r)
		}
	}
}
