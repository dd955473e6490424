package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a long-running program the harness started (dockerd, the plugin,
// etcd). Its stdout and stderr go to LogPath, appended across restarts. It is
// started with Pdeathsig=SIGKILL, so it dies with the test process even when
// t.Cleanup never runs (go test -timeout).
type Process struct {
	Name    string // "dockerd", "plugin", "etcd", ...
	LogPath string

	argv  []string
	env   []string
	ready func(ctx context.Context) error // nil: running is ready enough
	// onStarted is called after each (re)start once the process is ready.
	onStarted func(p *Process)
	// dumpedOnFailure: the owner logs the tail on failure (Host cleanup), so
	// start errors need not repeat it.
	dumpedOnFailure bool

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	untrack func()
	starts  int
}

// newProcess prepares (does not start) a process.
func newProcess(name, logPath string, argv, env []string, ready func(context.Context) error) *Process {
	return &Process{Name: name, LogPath: logPath, argv: argv, env: env, ready: ready}
}

// start starts the process and waits until it is ready.
func (p *Process) start(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := p.startErr(timeout); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

func (p *Process) startErr(timeout time.Duration) error {
	p.mu.Lock()
	if p.cmd != nil && !p.exited() {
		p.mu.Unlock()
		return fmt.Errorf("%s: already running (pid %d)", p.Name, p.cmd.Process.Pid)
	}
	p.starts++
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s: log file: %v", p.Name, err)
	}
	fmt.Fprintf(logf, "=== harness: start #%d at %s: %s\n", p.starts, time.Now().Format(time.RFC3339Nano), shellQuote(p.argv))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,            // our signals only, not the terminal's
		Pdeathsig: syscall.SIGKILL, // dies with the test process
	}
	if err := spawn(cmd); err != nil {
		logf.Close()
		p.mu.Unlock()
		return fmt.Errorf("%s: start %s: %v", p.Name, shellQuote(p.argv), err)
	}
	logf.Close() // the child has its own copy
	p.cmd = cmd
	p.done = make(chan struct{})
	p.waitErr = nil
	p.untrack = track(resource{Kind: "pid", Name: p.Name, Pid: cmd.Process.Pid, Start: procStartTime(cmd.Process.Pid)})
	done := p.done
	untrack := p.untrack
	go func() {
		err := cmd.Wait()
		untrack()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	p.mu.Unlock()

	if p.ready != nil {
		if err := p.waitReady(timeout); err != nil {
			return err
		}
	}
	if p.onStarted != nil {
		p.onStarted(p)
	}
	return nil
}

// waitReady polls p.ready until it succeeds, the process exits, or timeout.
func (p *Process) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready (%v)%s", p.Name, p.ExitErr(), p.logHint())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last = p.ready(ctx)
		cancel()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) not ready after %s: %v%s", p.Name, p.Pid(), timeout, last, p.logHint())
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func (p *Process) logHint() string {
	if p.dumpedOnFailure {
		return fmt.Sprintf("; see the tail of %s below", p.LogPath)
	}
	return fmt.Sprintf("; last 50 lines of %s:\n%s", p.LogPath, TailFile(p.LogPath, 50))
}

// exited: caller holds p.mu or accepts a racy answer.
func (p *Process) exited() bool {
	if p.done == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Exited reports whether the process is not running (never started, or exited).
func (p *Process) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited()
}

// Running reports whether the process runs.
func (p *Process) Running() bool { return !p.Exited() }

// ExitErr is the result of the last exit (nil while running or after exit 0).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Pid is the pid of the current (or last) incarnation, 0 if never started.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Signal sends sig to the process (not to its children).
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited() {
		return errors.New(p.Name + " is not running")
	}
	return p.cmd.Process.Signal(sig)
}

// Wait waits up to timeout for the process to exit and returns its exit error.
func (p *Process) Wait(timeout time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return p.ExitErr()
	case <-time.After(timeout):
		return fmt.Errorf("%s (pid %d) still running after %s", p.Name, p.Pid(), timeout)
	}
}

// Kill9 SIGKILLs the process and waits for it to be gone. Its children (if
// any) are not touched: that is what a crash looks like.
func (p *Process) Kill9(t testing.TB) {
	t.Helper()
	if p.Exited() {
		return
	}
	_ = p.Signal(syscall.SIGKILL)
	if err := p.Wait(10 * time.Second); err != nil && !p.Exited() {
		t.Fatalf("harness: %v", err)
	}
}

// Stop sends SIGTERM and waits up to StopTimeout for a clean exit; after that
// it SIGKILLs the process and fails the test (a daemon must stop on SIGTERM).
// It returns the exit error (nil for exit status 0).
func (p *Process) Stop(t testing.TB) error {
	t.Helper()
	clean, err := p.stop(StopTimeout)
	if !clean {
		t.Errorf("harness: %s (pid %d) did not exit within %s of SIGTERM; SIGKILLed it", p.Name, p.Pid(), StopTimeout)
	}
	return err
}

// stop: SIGTERM, wait, SIGKILL. clean is false when SIGKILL was needed.
func (p *Process) stop(timeout time.Duration) (clean bool, exitErr error) {
	if p.Exited() {
		return true, p.ExitErr()
	}
	_ = p.Signal(syscall.SIGTERM)
	if p.Wait(timeout) == nil || p.Exited() {
		return true, p.ExitErr()
	}
	_ = p.Signal(syscall.SIGKILL)
	_ = p.Wait(10 * time.Second)
	return false, p.ExitErr()
}

// Restart stops the process if it runs (SIGTERM, see Stop) and starts it
// again with the same arguments and environment, waiting until it is ready.
func (p *Process) Restart(t testing.TB) {
	t.Helper()
	if !p.Exited() {
		p.Stop(t)
	}
	p.start(t, PluginStartTimeout)
}

// Start starts a stopped (or killed) process again and waits until it is ready.
func (p *Process) Start(t testing.TB) {
	t.Helper()
	p.start(t, PluginStartTimeout)
}

// Log returns the whole log of the process (all incarnations).
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// LogContains reports whether the log contains s.
func (p *Process) LogContains(s string) bool { return strings.Contains(p.Log(), s) }

// LogTail returns the last n lines of the log.
func (p *Process) LogTail(n int) string { return TailFile(p.LogPath, n) }

// Pdeathsig is delivered when the *thread* that forked the child exits, and
// the Go runtime does end threads (a goroutine that exits while locked to its
// thread, e.g. after netns.Set). So every long-running child is forked from one
// dedicated goroutine that stays locked to its thread for the life of the test
// process.
type spawnReq struct {
	cmd *exec.Cmd
	res chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for r := range spawnCh {
				r.res <- r.cmd.Start()
			}
		}()
	})
	res := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, res: res}
	return <-res
}
