package main

import (
	"strings"
	"testing"
)

// TestReport: plain go test's output from a -json stream, the slowest
// tests in order, and the package lines last.
func TestReport(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p/a","Test":"TestFast"}`,
		`{"Action":"output","Package":"p/a","Test":"TestFast","Output":"=== RUN   TestFast\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestFast","Output":"    a_test.go:1: quiet log\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestFast","Output":"--- PASS: TestFast (0.10s)\n"}`,
		`{"Action":"pass","Package":"p/a","Test":"TestFast","Elapsed":0.1}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow/sub","Output":"    a_test.go:9: broken here\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow/sub","Output":"    host.go:3: a harness log line\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow/sub","Output":"--- FAIL: TestSlow/sub (30.00s)\n"}`,
		`{"Action":"fail","Package":"p/a","Test":"TestSlow/sub","Elapsed":30}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow","Output":"--- FAIL: TestSlow (31.00s)\n"}`,
		`{"Action":"fail","Package":"p/a","Test":"TestSlow","Elapsed":31}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    a_test.go:5: SKIPPED: needs root\n"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestSkip","Elapsed":0}`,
		`{"Action":"output","Package":"p/a","Output":"FAIL\n"}`,
		`{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t31.5s\n"}`,
		`{"Action":"fail","Package":"p/a","Elapsed":31.5}`,
		`{"Action":"output","Package":"p/b","Test":"TestMid","Output":"--- PASS: TestMid (2.00s)\n"}`,
		`{"Action":"pass","Package":"p/b","Test":"TestMid","Elapsed":2}`,
		`{"Action":"output","Package":"p/b","Output":"PASS\n"}`,
		`{"Action":"output","Package":"p/b","Output":"ok  \tp/b\t2.1s\n"}`,
		`{"Action":"pass","Package":"p/b","Elapsed":2.1}`,
		`# p/c`,
	}, "\n")
	var out strings.Builder
	r := newReport(&out)
	if err := r.consume(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	r.finish(2)
	got := out.String()
	for _, want := range []string{"broken here", "--- FAIL: TestSlow (31.00s)", "SKIPPED: needs root", "# p/c"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"quiet log", "=== RUN", "--- PASS"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q (plain go test hides passes):\n%s", unwanted, got)
		}
	}
	slowest := got[strings.Index(got, "The 2 slowest tests:"):]
	if i, j := strings.Index(slowest, "TestSlow"), strings.Index(slowest, "TestMid"); i < 0 || j < i || strings.Contains(slowest, "TestFast") {
		t.Errorf("slowest tests not TestSlow then TestMid only:\n%s", slowest)
	}
	saidAt := strings.Index(got, "What the failed tests said:")
	if saidAt < 0 {
		t.Fatalf("no section of what the failed tests said:\n%s", got)
	}
	said := got[saidAt:]
	if !strings.Contains(said, "TestSlow/sub: a_test.go:9: broken here") || strings.Contains(said, "harness log line") || strings.Contains(said, "needs root") {
		t.Errorf("the failed tests' own lines are not repeated, alone, before the package lines:\n%s", said)
	}
	if !strings.HasSuffix(got, "FAIL\tp/a\t31.5s\nok  \tp/b\t2.1s\nFAIL\n") {
		t.Errorf("output does not end with the package lines:\n%s", got)
	}
	if !r.failed {
		t.Error("a failed test did not fail the report")
	}
}

// TestReportParallelSubtests: a test whose subtests run in parallel
// reports itself as taking no time; the slowest tests show it as long as
// its longest subtest.
func TestReportParallelSubtests(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"pass","Package":"p/a","Test":"TestSplit/a","Elapsed":90}`,
		`{"Action":"pass","Package":"p/a","Test":"TestSplit/b","Elapsed":120}`,
		`{"Action":"pass","Package":"p/a","Test":"TestSplit","Elapsed":0}`,
		`{"Action":"pass","Package":"p/a","Test":"TestOther","Elapsed":100}`,
		`{"Action":"pass","Package":"p/b","Test":"TestSplit","Elapsed":1}`,
		`{"Action":"output","Package":"p/a","Output":"ok  \tp/a\t120s\n"}`,
		`{"Action":"pass","Package":"p/a","Elapsed":120}`,
	}, "\n")
	var out strings.Builder
	r := newReport(&out)
	if err := r.consume(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	r.finish(3)
	got := out.String()
	slowest := got[strings.Index(got, "The 3 slowest tests:"):]
	lines := strings.Split(strings.TrimSpace(slowest), "\n")
	if len(lines) < 4 || !strings.Contains(lines[1], "2m0s") || !strings.HasSuffix(lines[1], "p/a TestSplit") ||
		!strings.HasSuffix(lines[2], "p/a TestOther") || !strings.Contains(lines[3], "1s") || !strings.HasSuffix(lines[3], "p/b TestSplit") {
		t.Errorf("slowest tests not p/a TestSplit (2m0s, its longest subtest), TestOther, then p/b TestSplit (1s):\n%s", slowest)
	}
}
