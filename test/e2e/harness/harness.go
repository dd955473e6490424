// Package harness runs real Docker engines, each in its own network namespace,
// for the end-to-end tests of calico-cnm.
//
// One simulated Docker host (Host) is a network namespace named cnme2e-XXXXXX
// with its own dockerd (own data root, exec root, containerd, and its own
// /run/docker/plugins thanks to a private mount namespace), and optionally the
// calico-cnm daemon running in the same network namespace. Several hosts can be
// wired to one L2 bridge in the root namespace (Fabric).
//
// Everything a test creates is registered with t.Cleanup and torn down by pid,
// by name and by namespace inode - never by process name - even when the test
// fails. Resources are also recorded under /run/cnme2e-harness, so that a later
// run removes what a crashed run (e.g. go test -timeout) left behind.
//
// Typical use:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
//
//	func TestX(t *testing.T) {
//		harness.RequirePrereqs(t)
//		bin := harness.BuildBinary(t)
//		h := harness.NewHost(t, "node1", harness.HostOptions{})
//		h.ImportBusybox(t)
//		h.StartPlugin(t, bin, nil) // default "serve" args, embedded etcd
//		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "net1")
//		out := h.MustDocker(t, "run", "--rm", "--net", "net1", harness.Image, "ip", "-4", "addr")
//	}
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Paths of the programs the harness drives. The Debian docker CLI is used on
// purpose: /usr/local/bin/docker may be a much newer CLI than dockerd 20.10.
const (
	DockerdPath = "/usr/sbin/dockerd"
	DockerPath  = "/usr/bin/docker"
	BusyboxPath = "/bin/busybox"
	EtcdPath    = "/usr/bin/etcd"

	// Image is the name of the busybox image ImportBusybox creates (tag latest).
	Image = "bb"

	// NamePrefix prefixes every netns, interface and temp dir the harness makes.
	NamePrefix = "cnme2e"
)

var (
	// CommandTimeout bounds every docker / exec call of the harness.
	CommandTimeout = 2 * time.Minute
	// CrowdCommandTimeout bounds one docker command of a crowd issued at
	// once (see StartingCrowd): dockerd serialises part of every container
	// start and removal on the machine's one xtables lock, which the other
	// tests' dockerds share, so the last of 100 waits for the 99 others.
	CrowdCommandTimeout = 5 * time.Minute
	// DockerdStartTimeout bounds the wait for a new dockerd to answer.
	DockerdStartTimeout = 60 * time.Second
	// PluginStartTimeout bounds the wait for the plugin sockets to answer.
	PluginStartTimeout = 60 * time.Second
	// StopTimeout is how long SIGTERM gets before SIGKILL.
	StopTimeout = 20 * time.Second
)

// childPath is the PATH given to dockerd, the plugin and helper commands:
// Debian's own binaries first.
const childPath = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"

// ---------------------------------------------------------------- prerequisites

var prereqOnce sync.Once
var prereqMissing []string

// RequirePrereqs skips the test - loudly - when the machine cannot run the
// end-to-end tests at all: not root, or dockerd, the docker CLI or busybox
// missing. Anything else missing (nsenter, unshare, ip) is a broken setup and
// fails the test.
func RequirePrereqs(t testing.TB) {
	t.Helper()
	if testing.Short() {
		skipLoudly(t, "-short (make unit) leaves out tests that start dockerd in network namespaces")
	}
	prereqOnce.Do(func() {
		if os.Geteuid() != 0 {
			prereqMissing = append(prereqMissing, fmt.Sprintf("not running as root (euid %d)", os.Geteuid()))
		}
		for _, p := range []string{DockerdPath, DockerPath, BusyboxPath} {
			if _, err := os.Stat(p); err != nil {
				prereqMissing = append(prereqMissing, p+" is absent")
			}
		}
	})
	if len(prereqMissing) > 0 {
		skipLoudly(t, strings.Join(prereqMissing, "; "))
	}
	for _, tool := range []string{"nsenter", "unshare", "ip", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("harness: %s not found in PATH (util-linux / iproute2 / tar): %v", tool, err)
		}
	}
}

// RequireRoot skips (loudly) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		skipLoudly(t, "-short (make unit) leaves out tests that need root")
	}
	if os.Geteuid() != 0 {
		skipLoudly(t, fmt.Sprintf("not running as root (euid %d)", os.Geteuid()))
	}
}

// RequireFile skips (loudly) unless path exists; what says what it is for.
func RequireFile(t testing.TB, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		skipLoudly(t, fmt.Sprintf("%s (%s) is absent", path, what))
	}
}

func skipLoudly(t testing.TB, why string) {
	t.Helper()
	bar := strings.Repeat("!", 78)
	banner := fmt.Sprintf("%s\n!!! SKIPPED: %s\n!!! because %s\n!!! (end-to-end tests need root, %s, %s and %s from busybox-static)\n%s",
		bar, t.Name(), why, DockerdPath, DockerPath, BusyboxPath, bar)
	t.Log("\n" + banner)
	fmt.Fprintln(os.Stderr, banner) // visible without -v too
	t.Skipf("SKIPPED: %s because %s", t.Name(), why)
}

// ---------------------------------------------------------------- process-wide state

var (
	procDirOnce sync.Once
	procDir     string
	procDirErr  error
)

// processDir is a temp dir shared by the whole test process (built binaries,
// busybox tarball, docker CLI config). Main removes it.
func processDir(t testing.TB) string {
	t.Helper()
	dir, err := makeProcessDir()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return dir
}

// makeProcessDir makes the process-wide temp dir once.
func makeProcessDir() (string, error) {
	procDirOnce.Do(func() {
		procDir, procDirErr = os.MkdirTemp("", NamePrefix+"-proc-")
		if procDirErr == nil {
			track(resource{Kind: "procdir", Name: procDir})
		}
	})
	if procDirErr != nil {
		return "", fmt.Errorf("temp dir: %w", procDirErr)
	}
	return procDir, nil
}

// Main wraps m.Run: it sweeps what crashed earlier runs left behind, runs the
// tests, and then removes the process-wide temp dir and anything this process
// still has registered. Use it from TestMain: os.Exit(harness.Main(m)).
func Main(m *testing.M) int {
	if os.Geteuid() == 0 {
		SweepStale(func(format string, args ...any) { fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...) })
	}
	code := m.Run()
	if left := Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "harness: resources still present after all tests: %s\n", strings.Join(left, ", "))
	}
	if procDir != "" {
		_ = os.RemoveAll(procDir)
	}
	if dockerCfgDir != "" {
		_ = os.RemoveAll(dockerCfgDir)
	}
	forgetOwnerDir()
	return code
}

// randHex returns n random hex characters.
func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

// ---------------------------------------------------------------- module root and build

// ModuleRoot returns the directory of the go.mod this package belongs to, found
// by walking up from the working directory.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := moduleRoot()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return dir
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("getwd: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

type buildResult struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*buildResult{}
)

// BuildBinary builds ./cmd/calico-cnm (CGO_ENABLED=0) once per test process and
// returns the path of the binary.
func BuildBinary(t testing.TB) string {
	t.Helper()
	return BuildPackage(t, binaryPackage)
}

// BuildPackage builds a main package given relative to the module root (e.g.
// "./cmd/calico-cnm") once per test process, and returns the binary's path.
// A failed build fails the test with the compiler output.
func BuildPackage(t testing.TB, pkg string) string {
	t.Helper()
	path, took, err := buildOnce(pkg)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if took > 0 {
		t.Logf("harness: built %s in %s", pkg, took.Round(time.Millisecond))
	}
	return path
}

// PrebuildBinary builds ./cmd/calico-cnm before the tests start, for a
// TestMain. Every calico-cnm build of the tests (this one, make build, the
// plugin's and the versioned ones) compiles with the same flags, so after
// it they only link. Started together by the first parallel tests, each
// compiled the whole tree again from a cold cache: four times at once, a
// minute of both cores. A failed build is reported to the tests that need
// the binary.
func PrebuildBinary() {
	if _, took, err := buildOnce(binaryPackage); err == nil {
		fmt.Fprintf(os.Stderr, "harness: built %s in %s before the tests\n", binaryPackage, took.Round(time.Millisecond))
	}
}

// binaryPackage is calico-cnm's main package, relative to the module root.
const binaryPackage = "./cmd/calico-cnm"

// buildOnce builds pkg the first time it is asked for; took is zero for a
// build made before.
func buildOnce(pkg string) (path string, took time.Duration, err error) {
	buildsMu.Lock()
	r := builds[pkg]
	if r == nil {
		r = &buildResult{}
		builds[pkg] = r
	}
	buildsMu.Unlock()
	r.once.Do(func() {
		start := time.Now()
		r.path, r.err = goBuild(pkg)
		took = time.Since(start)
	})
	return r.path, took, r.err
}

// goBuild runs go build for pkg into the process dir.
func goBuild(pkg string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := makeProcessDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bin", filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// -trimpath as make build and scripts/build-plugin.sh: they then
	// reuse these compiled packages from the build cache and only
	// link (without it the managed-plugin tests compile everything
	// again, minutes on a small machine).
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s (in %s): %w\n%s", pkg, root, err, b)
	}
	return out, nil
}

// ---------------------------------------------------------------- commands

// runCmd runs argv with a timeout and returns stdout; the error carries the
// exit status and stderr.
func runCmd(ctx context.Context, env []string, argv ...string) (string, error) {
	return runCmdTimeout(ctx, CommandTimeout, env, argv...)
}

// runCmdTimeout is runCmd with an explicit timeout.
func runCmdTimeout(ctx context.Context, timeout time.Duration, env []string, argv ...string) (string, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	if cmd.Env == nil {
		cmd.Env = baseEnv()
	}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %s", timeout)
		}
		return stdout.String(), fmt.Errorf("%s: %v: %s", shellQuote(argv), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// baseEnv is the environment of helper commands: the test's environment
// without anything that would redirect the docker CLI, and a sane PATH.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+childPath)
}

// Run runs a command in the root namespaces (for test setup that is not
// per-host), failing the test on error. It returns stdout.
func Run(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := runCmd(nil, nil, argv...)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return out
}

func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$\\;&|<>*?()[]{}") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}

// TailFile returns the last n lines of a file ("" if it cannot be read).
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Eventually polls cond every interval until it returns nil or timeout
// passes; then it fails the test with the last error.
func Eventually(t testing.TB, timeout, interval time.Duration, what string, cond func() error) {
	t.Helper()
	if err := EventuallyErr(timeout, interval, cond); err != nil {
		t.Fatalf("%s: not true after %s: %v", what, timeout, err)
	}
}

// EventuallyErr polls cond like Eventually and returns its last error
// (nil once it held), for a test that reports it among others.
func EventuallyErr(timeout, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
	}
}
