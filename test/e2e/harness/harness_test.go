package harness

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestCrashedRunIsSwept runs a helper test process that creates a host (netns,
// dockerd, a running container) and a fabric, SIGKILLs it - like go test
// -timeout does, without any t.Cleanup - and checks that its children died
// with it (Pdeathsig) and that SweepStale removes the rest.
func TestCrashedRunIsSwept(t *testing.T) {
	if os.Getenv("CNME2E_CRASH_HELPER") == "1" {
		crashHelper(t)
		return
	}
	RequirePrereqs(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashedRunIsSwept$", "-test.v")
	cmd.Env = append(os.Environ(), "CNME2E_CRASH_HELPER=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var netns, dir, bridge string
	sc := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
	for sc.Scan() {
		line := sc.Text()
		t.Log("helper: " + line)
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "HELPER-READY "); ok {
			f := strings.Fields(rest)
			netns, dir, bridge = f[0], f[1], f[2]
			break
		}
	}
	deadline.Stop()
	if netns == "" {
		t.Fatalf("helper did not get ready")
	}
	go func() { _, _ = bufio.NewReader(stdout).WriteTo(devNull{}) }()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	// dockerd (Pdeathsig) and containerd die with the test process.
	Eventually(t, 20*time.Second, 100*time.Millisecond, "dockerd and containerd gone", func() error {
		for _, p := range allProcs() {
			c := procCmdline(p.pid)
			if strings.Contains(c, dir) && (strings.Contains(c, "dockerd") || strings.Contains(c, "containerd --config")) {
				return fmt.Errorf("pid %d still runs: %s", p.pid, c)
			}
		}
		return nil
	})
	if _, err := os.Stat(netnsPath(netns)); err != nil {
		// A concurrently starting test binary (harness.Main) may have swept it.
		t.Logf("the crashed run's netns %s is already gone: %v", netns, err)
	}

	var logs []string
	SweepStale(func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) })
	t.Logf("sweep:\n%s", strings.Join(logs, "\n"))
	if _, err := os.Stat(netnsPath(netns)); !os.IsNotExist(err) {
		t.Errorf("netns %s survived the sweep", netns)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dir %s survived the sweep", dir)
	}
	if _, err := net.InterfaceByName(bridge); err == nil {
		t.Errorf("bridge %s survived the sweep", bridge)
	}
	for _, p := range allProcs() {
		if c := procCmdline(p.pid); strings.Contains(c, dir) {
			t.Errorf("pid %d survived the sweep: %s", p.pid, c)
		}
	}
	// The crashed container (sleep 1234) ran under a shim of that dockerd.
	for _, p := range allProcs() {
		if procCmdline(p.pid) == "sleep 1234" {
			t.Errorf("container process %d survived the sweep", p.pid)
		}
	}
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

func crashHelper(t *testing.T) {
	f := NewFabric(t, "")
	h := f.AddHost(t, "crash", HostOptions{})
	h.ImportBusybox(t)
	h.MustDocker(t, "run", "-d", "--net", "none", Image, "sleep", "1234")
	fmt.Printf("HELPER-READY %s %s %s\n", h.Netns, h.Dir, f.Bridge)
	time.Sleep(time.Hour)
}

func TestAddrHelpers(t *testing.T) {
	_, n, _ := net.ParseCIDR("172.31.254.0/24")
	if got := addrAt(n, 1).String(); got != "172.31.254.1" {
		t.Errorf("addrAt: %s", got)
	}
	if got := broadcast(n).String(); got != "172.31.254.255" {
		t.Errorf("broadcast: %s", got)
	}
	if prefixLen(n) != 24 {
		t.Errorf("prefixLen")
	}
	_, n6, _ := net.ParseCIDR("fd63:6e6d:ab::/64")
	if got := addrAt(n6, 3).String(); got != "fd63:6e6d:ab::3" {
		t.Errorf("addrAt IPv6: %s", got)
	}
}
