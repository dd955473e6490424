// Command testreport runs `go test -json ...` and prints what plain
// `go test` would (the output of failed and skipped tests, each package's
// ok/FAIL line), with the slowest top-level tests before the package lines
// so that the run still ends with go test's own summary. It exits with go
// test's status.
//
//	go run ./test/testreport [-n 10] -- go test -json -count=1 ./...
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one finished top-level test.
type timing struct {
	Package, Test, Result string
	Elapsed               time.Duration
}

// report turns the event stream into go test's plain output.
type report struct {
	out      io.Writer
	buffered map[string][]string // package + "\x00" + test -> its output so far
	summary  []string            // the packages' ok/FAIL/? lines
	timings  []timing
	// longestSub: package + "\x00" + top-level test -> its longest
	// subtest so far.
	longestSub map[string]time.Duration
	said       []string // failed tests' lines from their _test.go files
	failed     bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, buffered: map[string][]string{}, longestSub: map[string]time.Duration{}}
}

// isSummary: the one line go test prints per package when it is done.
func isSummary(line string) bool {
	for _, p := range []string{"ok  \t", "FAIL\t", "?   \t"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func (r *report) handle(e event) {
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "output", "build-output":
		if e.Test != "" {
			r.buffered[key] = append(r.buffered[key], e.Output)
			return
		}
		switch {
		case isSummary(e.Output):
			// Held back: the run must end with these lines.
			r.summary = append(r.summary, e.Output)
		case e.Output == "PASS\n", strings.HasPrefix(e.Output, "=== "):
		default:
			fmt.Fprint(r.out, e.Output)
		}
	case "pass", "fail", "skip":
		if e.Action == "fail" {
			r.failed = true
		}
		if e.Test == "" {
			return
		}
		// As plain go test: the output of failures (and, so that no skip
		// goes unnoticed, of skips); nothing of passes.
		if e.Action != "pass" {
			for _, l := range r.buffered[key] {
				if !strings.HasPrefix(l, "=== ") {
					fmt.Fprint(r.out, l)
				}
			}
		}
		if e.Action == "fail" {
			r.keepSaid(e.Test, r.buffered[key])
		}
		delete(r.buffered, key)
		elapsed := time.Duration(e.Elapsed * float64(time.Second))
		top, _, sub := strings.Cut(e.Test, "/")
		topKey := e.Package + "\x00" + top
		if sub {
			// A test whose subtests run in parallel reports itself as
			// taking no time: it lasted as long as its longest subtest.
			r.longestSub[topKey] = max(r.longestSub[topKey], elapsed)
			break
		}
		r.timings = append(r.timings, timing{e.Package, e.Test, e.Action, max(elapsed, r.longestSub[topKey])})
		delete(r.longestSub, topKey)
	case "build-fail":
		r.failed = true
	}
}

// testFileLine is a line a test wrote through t.Log/t.Error from one of its
// _test.go files (helpers marked t.Helper report their caller's line).
var testFileLine = regexp.MustCompile(`^\s+\S+_test\.go:\d+: `)

// Bounds of the repeated lines: enough to say why, not a second log.
const (
	saidPerTest  = 20
	saidLineSize = 400
)

// keepSaid keeps the first saidPerTest test-file lines of failed test name.
func (r *report) keepSaid(name string, lines []string) {
	kept := 0
	for _, l := range lines {
		if kept == saidPerTest {
			break
		}
		if !testFileLine.MatchString(l) {
			continue
		}
		l = strings.TrimSpace(l)
		if len(l) > saidLineSize {
			l = l[:saidLineSize] + " ..."
		}
		r.said = append(r.said, name+": "+l)
		kept++
	}
}

// finish prints the slowest n tests, what the failed tests said, and then
// the package lines.
func (r *report) finish(n int) {
	slices.SortFunc(r.timings, func(a, b timing) int { return cmp.Compare(b.Elapsed, a.Elapsed) })
	if len(r.timings) > n {
		r.timings = r.timings[:n]
	}
	if len(r.timings) > 0 {
		fmt.Fprintf(r.out, "\nThe %d slowest tests:\n", len(r.timings))
		for _, t := range r.timings {
			fmt.Fprintf(r.out, "  %8s  %-4s  %s %s\n", t.Elapsed.Round(100*time.Millisecond), strings.ToUpper(t.Result), t.Package, t.Test)
		}
		fmt.Fprintln(r.out)
	}
	if len(r.said) > 0 {
		fmt.Fprintln(r.out, "What the failed tests said:")
		for _, l := range r.said {
			fmt.Fprintf(r.out, "  %s\n", l)
		}
		fmt.Fprintln(r.out)
	}
	for _, l := range r.summary {
		fmt.Fprint(r.out, l)
	}
	if r.failed {
		fmt.Fprintln(r.out, "FAIL") // as plain go test ends a failed run
	}
}

// consume reads the stream; lines that are not JSON (go vet output, a
// crash of go test itself) pass through.
func (r *report) consume(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if line := sc.Bytes(); len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(r.out, "%s\n", line)
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func main() {
	n := flag.Int("n", 10, "how many of the slowest tests to print")
	keep := flag.String("json", "", "also write go test's -json stream to this file (each test's start, end and output, for a timeline)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testreport [-n N] [-json FILE] -- go test -json [flags] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	// The file first: a failure to create it must not leave go test
	// running.
	var kept *os.File
	if *keep != "" {
		var err error
		if kept, err = os.Create(*keep); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
	}
	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	var in io.Reader = stdout
	if kept != nil {
		in = io.TeeReader(stdout, kept)
	}
	r := newReport(os.Stdout)
	readErr := r.consume(in)
	if kept != nil {
		readErr = cmp.Or(readErr, kept.Close())
	}
	err = cmd.Wait()
	r.finish(*n)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil || readErr != nil:
		fmt.Fprintln(os.Stderr, "testreport:", cmp.Or(err, readErr))
		os.Exit(2)
	case r.failed:
		// go test said 0 but a test failed: never report success then.
		os.Exit(1)
	}
}
