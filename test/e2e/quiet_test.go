package e2e

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestStartAndCleanStopLogNoWarning: the daemon at its default log level,
// with its embedded etcd member and Docker answering, logs nothing at
// warning or above from its start to a clean stop (issue 20 item 6: etcd's
// start-up and stop warnings are gone).
func TestStartAndCleanStopLogNoWarning(t *testing.T) {
	t.Parallel()
	bin := harness.BuildBinary(t)
	h := harness.NewHost(t, "quietstop", harness.HostOptions{})
	args := h.ServeArgs(nil)
	i := slices.Index(args, "--log-level")
	if i < 0 {
		t.Fatalf("serve arguments %v carry no --log-level", args)
	}
	args[i+1] = "info"
	p := h.StartPlugin(t, bin, nil, args...)
	stopCleanly(t, p)
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(p.Log()), "\n") {
		m := logrusLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		lines++
		switch m[1] {
		case "warning", "error", "fatal", "panic":
			t.Errorf("%s-level line between a start and a clean stop: %q", m[1], line)
		}
	}
	if lines == 0 {
		t.Fatalf("the daemon logged nothing at info: is the log read?\n%s", p.LogTail(20))
	}
}

// stopCleanly stops the daemon p with SIGTERM and fails unless it exits
// cleanly within harness.StopTimeout.
func stopCleanly(t *testing.T, p *harness.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(harness.StopTimeout); err != nil {
		t.Fatalf("daemon did not exit cleanly on SIGTERM: %v\n%s", err, p.LogTail(40))
	}
}
