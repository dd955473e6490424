package e2e

import (
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// logrusLine is one line of the daemon's log format (logrus text).
var logrusLine = regexp.MustCompile(`^time="[^"]+" level=(\w+) msg=`)

// TestCleanStopLogsNoErrors: the daemon with its embedded etcd member,
// stopped by SIGTERM, logs nothing at error level and writes one format
// only (logrus), etcd's own messages included (issue 12 item 9).
func TestCleanStopLogsNoErrors(t *testing.T) {
	bin := harness.BuildBinary(t)
	h := harness.NewHost(t, "cleanstop", harness.HostOptions{NoDockerd: true})
	p := h.StartPlugin(t, bin, nil) // --log-level debug: etcd's info lines too
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(harness.StopTimeout); err != nil {
		t.Fatalf("daemon did not exit cleanly on SIGTERM: %v\n%s", err, p.LogTail(40))
	}
	etcdLines := 0
	for _, line := range strings.Split(strings.TrimSpace(p.Log()), "\n") {
		if strings.HasPrefix(line, "=== harness:") {
			continue
		}
		m := logrusLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("log line in a second format: %q", line)
			continue
		}
		switch m[1] {
		case "error", "fatal", "panic":
			t.Errorf("%s-level line on a clean stop: %q", m[1], line)
		}
		if strings.Contains(line, " component=etcd") {
			etcdLines++
		}
	}
	if etcdLines == 0 {
		t.Errorf("no etcd log line went through logrus (component=etcd) at --log-level debug")
	}
}
