package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A command someone printed: where, and the text after "calico-cnm".
type printedCommand struct {
	where string
	args  string
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

var (
	backtickSpan = regexp.MustCompile("`([^`]+)`")
	// The program as a command word: at the start, after a space or an
	// opening parenthesis, or as a bin/ path (./bin/calico-cnm).
	commandWord = regexp.MustCompile(`(?:^|[\s(])(?:\S*bin/)?calico-cnm\s+(\S.*)$`)
	flagToken   = regexp.MustCompile(`(?:^|[\s\[(|])(--?[A-Za-z][\w-]*)`)
)

// commandsInSpan finds "calico-cnm ..." in one backticked span or one
// shell line (without its comment).
func commandsInSpan(where, s string, shell bool) []printedCommand {
	var out []printedCommand
	parts := []string{s}
	if shell {
		if i := strings.Index(s, " #"); i >= 0 {
			s = s[:i]
		}
		parts = regexp.MustCompile(`&&|;|\||\$\(`).Split(s, -1)
	}
	for _, p := range parts {
		if m := commandWord.FindStringSubmatch(strings.TrimSpace(p)); m != nil {
			out = append(out, printedCommand{where, strings.TrimSpace(m[1])})
		}
	}
	return out
}

// markdownCommands: the commands in the code blocks (fenced or indented)
// and backticked spans of a markdown file.
func markdownCommands(t *testing.T, path string) []printedCommand {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []printedCommand
	fenced := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		where := filepath.Base(path) + ":" + strconv.Itoa(n)
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || strings.HasPrefix(line, "    ") {
			out = append(out, commandsInSpan(where, line, true)...)
			continue
		}
		for _, m := range backtickSpan.FindAllStringSubmatch(strings.ReplaceAll(line, `\|`, "|"), -1) {
			out = append(out, commandsInSpan(where, m[1], false)...)
		}
	}
	return out
}

// sourceCommands: backticked commands in the string literals of the
// module's Go sources (error messages and help texts).
func sourceCommands(t *testing.T, root string) []printedCommand {
	t.Helper()
	var out []printedCommand
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || !strings.HasPrefix(lit.Value, `"`) {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			rel, _ := filepath.Rel(root, fset.Position(lit.Pos()).Filename)
			where := rel + ":" + strconv.Itoa(fset.Position(lit.Pos()).Line)
			for _, m := range backtickSpan.FindAllStringSubmatch(s, -1) {
				out = append(out, commandsInSpan(where, m[1], false)...)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkPrinted resolves a printed command in the tree: every command word
// must be a command and every flag one of its flags; then `--help` on it
// must work. It returns what is wrong.
func checkPrinted(root *cobra.Command, pc printedCommand) []string {
	c := root
	var path []string
	for _, tok := range strings.Fields(pc.args) {
		if strings.Contains(tok, "%") || !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(tok) {
			break // a flag, a placeholder, or a format verb filled in at run time
		}
		if sub, _, err := c.Find([]string{tok}); err == nil && sub != c {
			c = sub
			path = append(path, tok)
			continue
		}
		if c.HasAvailableSubCommands() {
			return []string{fmt.Sprintf("%s: `calico-cnm %s`: %q is not a subcommand of %q", pc.where, pc.args, tok, c.CommandPath())}
		}
		break // a positional argument
	}
	var problems []string
	for _, m := range flagToken.FindAllStringSubmatch(pc.args, -1) {
		if !hasFlag(c, m[1]) {
			problems = append(problems, fmt.Sprintf("%s: `calico-cnm %s`: %q has no flag %s", pc.where, pc.args, c.CommandPath(), m[1]))
		}
	}
	if r := cliRun(nil, append(path, "--help")...); r.code != exitOK || !strings.Contains(r.stdout, "Usage:") {
		problems = append(problems, fmt.Sprintf("%s: calico-cnm %s --help: %s", pc.where, strings.Join(path, " "), r))
	}
	return problems
}

// hasFlag: c accepts the flag token ("--name" or "-x"), its own or inherited.
func hasFlag(c *cobra.Command, tok string) bool {
	if tok == "--help" || tok == "-h" {
		return true
	}
	for _, fs := range []*pflag.FlagSet{c.Flags(), c.InheritedFlags()} {
		switch {
		case strings.HasPrefix(tok, "--"):
			if fs.Lookup(tok[2:]) != nil {
				return true
			}
		case len(tok) == 2:
			if fs.ShorthandLookup(tok[1:]) != nil {
				return true
			}
		}
	}
	return false
}

// TestPrintedCommandsExist: every `calico-cnm ...` command printed in the
// README, the docs and the Go sources' messages names commands and flags
// that exist.
func TestPrintedCommandsExist(t *testing.T) {
	root := moduleRoot(t)
	var cmds []printedCommand
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, md := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		cmds = append(cmds, markdownCommands(t, md)...)
	}
	fromREADME := len(cmds)
	cmds = append(cmds, sourceCommands(t, root)...)
	if fromREADME < 20 || len(cmds)-fromREADME < 5 {
		t.Fatalf("found only %d commands in the docs and %d in the sources: is the scanner broken?", fromREADME, len(cmds)-fromREADME)
	}
	tree := testTree()
	for _, pc := range cmds {
		for _, p := range checkPrinted(tree, pc) {
			t.Error(p)
		}
	}
	t.Logf("checked %d printed commands (%d in the docs)", len(cmds), fromREADME)
	for _, pc := range cmds {
		t.Logf("  %s: calico-cnm %s", pc.where, pc.args)
	}
}

// TestConfigurationTableFlags: every flag in the README's Configuration
// table (the first column) is a flag of `calico-cnm serve`.
func TestConfigurationTableFlags(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	serve, _, err := testTree().Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `(--[a-z0-9-]+)`").FindAllStringSubmatch(string(b), -1)
	if len(rows) < 20 {
		t.Fatalf("found only %d flag rows in the README's tables", len(rows))
	}
	for _, m := range rows {
		if !hasFlag(serve, m[1]) {
			t.Errorf("README table row %s: serve has no such flag", m[1])
		}
	}
}

// TestPrintedCommandsScanner: the scanner catches what it must, so the test
// above can fail.
func TestPrintedCommandsScanner(t *testing.T) {
	tree := testTree()
	for _, c := range []struct {
		args string
		ok   bool
	}{
		{"pool add CIDR [--block-size N] [--nat-outgoing]", true},
		{"bgp config --node NODE [--route-reflector=true|false]", true},
		{"pool add 10.0.0.0/16 --etcd-endpoints http://x:2379", true},
		{"node status [-o json] [--state-dir D]", true},
		{"pool add %s", true},
		{"ipam configure --max-blocks-per-host N", true},
		{"pool resize CIDR", false},
		{"pool delete CIDR --nat-outgoing", false},
		{"ipam show --ip 1.2.3.4", false},
		{"frobnicate", false},
		{"node status -x", false},
	} {
		if problems := checkPrinted(tree, printedCommand{"case", c.args}); (len(problems) == 0) != c.ok {
			t.Errorf("`calico-cnm %s`: problems %q, want ok=%v", c.args, problems, c.ok)
		}
	}
	got := commandsInSpan("x", "make plugin   # static bin/calico-cnm -> bin/plugin", true)
	got = append(got, commandsInSpan("x", `C2=$(./bin/calico-cnm ipam show -o json) && calico-cnm pool list`, true)...)
	got = append(got, commandsInSpan("x", "/var/lib/calico-cnm", false)...)
	if len(got) != 2 || got[0].args != "ipam show -o json)" || got[1].args != "pool list" {
		t.Errorf("scanned %+v", got)
	}
}
