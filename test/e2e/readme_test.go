package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// readmeBlock returns the ```sh block between <!-- NAME:begin --> and
// <!-- NAME:end --> in README.md, as a user would paste it.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return markedBlock(t, "README.md", string(b), name)
}

// markedBlock returns the ```sh block between <!-- NAME:begin --> and
// <!-- NAME:end --> in text (the content of file).
func markedBlock(t *testing.T, file, text, name string) string {
	t.Helper()
	begin := strings.Index(text, "<!-- "+name+":begin -->")
	end := strings.Index(text, "<!-- "+name+":end -->")
	if begin < 0 || end < begin {
		t.Fatalf("%s has no %s:begin/end markers", file, name)
	}
	block := text[begin:end]
	start := strings.Index(block, "```sh\n")
	stop := strings.LastIndex(block, "```")
	if start < 0 || stop <= start {
		t.Fatalf("%s block %s has no ```sh fence", file, name)
	}
	return block[start+len("```sh\n") : stop]
}

// userSandbox is a stand-in for a user's Debian host: a throw-away netns
// (with an uplink and a default route) and a private mount namespace whose
// /run, /var/lib/docker, /var/lib/calico-cnm and /var/log are the test's
// own, so a command that uses the default paths (`make run`, dockerd with
// no flags, `docker plugin create`) touches nothing of the machine's.
type userSandbox struct {
	host    *harness.Host
	root    string // the checkout: the user's working directory
	dirs    string
	main    *harness.Process // the long-running command the sandbox was made for
	mountNS string
}

// newUserSandbox starts command (run by sh in the checkout) as the
// sandbox's main process, in the private mount namespace.
func newUserSandbox(t *testing.T, name, command string) *userSandbox {
	t.Helper()
	harness.RequirePrereqs(t)
	sb := &userSandbox{root: harness.ModuleRoot(t), dirs: t.TempDir()}
	sb.host = harness.NewFabric(t, "").AddHost(t, name, harness.HostOptions{NoDockerd: true})
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	var mounts []string
	for _, d := range []string{"/var/lib/docker", "/var/lib/calico-cnm", "/var/log"} {
		src := filepath.Join(sb.dirs, strings.ReplaceAll(strings.TrimPrefix(d, "/"), "/", "_"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", d, src, d))
	}
	wrapper := "set -e; mount -t tmpfs tmpfs /run; " + strings.Join(mounts, "; ") + "; cd " + sb.root + " && exec " + command
	env := append(userGoEnv(t, goBin), "DOCKER_HOST=") // the default socket, as in a user's shell
	sb.main = sb.host.StartProcess(t, name+"-main", env, nil, "unshare", "-m", "--propagation", "private", "sh", "-c", wrapper)
	sb.mountNS = fmt.Sprintf("/proc/%d/ns/mnt", sb.main.Pid())
	return sb
}

// userGoEnv is a root shell's environment, with Go's caches where this test
// process has them and the module proxy off: the sandbox has no route to
// it, so a build must come from the cache (CI fills it with `make deps`).
func userGoEnv(t *testing.T, goBin string) []string {
	t.Helper()
	env := []string{
		"PATH=" + filepath.Dir(goBin) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"GOPROXY=off",
	}
	for _, v := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, err := exec.Command(goBin, "env", v).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", v, err)
		}
		env = append(env, v+"="+strings.TrimSpace(string(out)))
	}
	return env
}

// path is a path inside the sandbox's mount namespace, seen from here.
func (sb *userSandbox) path(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", sb.main.Pid(), p)
}

// waitFor polls until p exists in the sandbox.
func (sb *userSandbox) waitFor(t *testing.T, p string, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, 500*time.Millisecond, p+" in the sandbox", func() error {
		if sb.main.Exited() {
			return fmt.Errorf("sandbox command exited: %v\n%s", sb.main.ExitErr(), sb.main.LogTail(30))
		}
		_, err := os.Stat(sb.path(p))
		return err
	})
}

// shell pastes script into `sh -ex` in the sandbox, in the checkout, and
// returns everything it printed.
func (sb *userSandbox) shell(t *testing.T, script string, timeout time.Duration) string {
	t.Helper()
	goBin, _ := exec.LookPath("go")
	cmd := exec.Command("nsenter", "--net="+sb.host.NetnsPath, "--mount="+sb.mountNS, "--wd="+sb.root, "--", "sh", "-ex", "-c", script)
	cmd.Env = append(userGoEnv(t, goBin), "DOCKER_CONFIG="+t.TempDir())
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("pasted commands did not finish in %s:\n%s", timeout, out)
	}
	t.Logf("output:\n%s", out)
	if err != nil {
		t.Fatalf("pasted commands failed: %v\nsandbox log:\n%s", err, sb.main.LogTail(40))
	}
	return string(out)
}

func requireOutput(t *testing.T, text string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// buildCheckout runs `make build` in the checkout, the build the README's
// `make run` and `make plugin` start with, while it holds an exclusive
// flock on the module root. The README tests run in parallel with each
// other: two builds into bin/ at once could hand one of them a binary
// still being written. Once bin/calico-cnm is current, the `make run` or
// `make plugin` a test then pastes finds it up to date (same source, same
// flags) and rewrites nothing, so the lock is released on return. A flock,
// not a mutex: the lock lives in the kernel, not in package state.
func buildCheckout(t *testing.T) {
	t.Helper()
	root := harness.ModuleRoot(t)
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // releases the lock
	began := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("flock %s: %v", root, err)
	}
	locked := time.Now()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "build")
	cmd.Dir = root
	cmd.Env = userGoEnv(t, goBin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build in %s: %v\n%s", root, err, out)
	}
	t.Logf("make build in the checkout: waited %s for the lock, built in %s",
		locked.Sub(began).Round(time.Millisecond), time.Since(locked).Round(time.Millisecond))
}

// TestReadmeQuickStart runs the README's two promises together: `make run`
// as written (it starts dockerd, since none answers, and the daemon on its
// embedded etcd with the default socket dir), then the quick start pasted
// into a shell.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	buildCheckout(t)
	sb := newUserSandbox(t, "readme", "make run")
	sb.waitFor(t, "/run/docker/plugins/calico-ipam.sock", 4*time.Minute)
	text := sb.shell(t, readmeBlock(t, "quickstart"), 3*time.Minute)
	requireOutput(t, text,
		"default via 169.254.1.1 dev eth0",
		"2 packets transmitted, 2 packets received",
		"blackhole 192.168.",
		"192.168.0.77/32",
	)
	// The published port answered on 127.0.0.1 and is listed; c1 on two
	// networks reached c3 and c2.
	for _, re := range []string{`(?m)^published-web$`, `(?m)\s8080/tcp -> 0\.0\.0\.0:18080$`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("output lacks a line matching %s", re)
		}
	}
	if n := strings.Count(text, "2 packets transmitted, 2 packets received"); n != 3 {
		t.Errorf("%d pings answered in full, want 3 (c2, then c3 and c2 from c1 on two networks)", n)
	}
	// make run names the node after the hostname, as a user's daemon does.
	if hostname, _ := os.Hostname(); !regexp.MustCompile(`(?m)^192\.168\.\S+/26\s+192\.168\.0\.0/16\s+` + regexp.QuoteMeta(hostname) + `\s+2\s+62$`).MatchString(text) {
		t.Errorf("ipam show does not list a block of host %s with 2 used, 62 free", hostname)
	}
	if links, _ := sb.host.Exec(t, "ip", "-o", "link", "show"); strings.Contains(links, "cali") {
		t.Errorf("cali veths left after the quick start removed its containers:\n%s", links)
	}
}

// TestReadmeVXLAN pastes the README's VXLAN block on a host running `make
// run`: a VXLAN pool gives the host vxlan.calico and its VTEP, containers
// the reduced MTU; deleting the pool removes the device again.
func TestReadmeVXLAN(t *testing.T) {
	t.Parallel()
	buildCheckout(t)
	sb := newUserSandbox(t, "readme-vxlan", "make run")
	sb.waitFor(t, "/run/docker/plugins/calico-ipam.sock", 4*time.Minute)
	text := sb.shell(t, readmeBlock(t, "vxlan"), 3*time.Minute)
	requireOutput(t, text,
		"pool 10.44.0.0/16 added (block size /26, vxlanMode CrossSubnet)",
		"\n1450\n",
		"VXLAN: device vxlan.calico, VTEP 10.44.",
		"vxlan id 4096",
		"dstport 4789",
		"nolearning",
		"pool 10.44.0.0/16: vxlanMode Always",
		"pool 10.44.0.0/16 deleted",
	)
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "vxlan.calico removed with the last VXLAN pool", func() error {
		if out, err := sb.host.Exec(t, "ip", "link", "show", "vxlan.calico"); err == nil {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}

// TestReadmeManagedQuickStart pastes the README's managed-plugin quick start
// on a host whose dockerd runs with its defaults, as on a fresh install.
func TestReadmeManagedQuickStart(t *testing.T) {
	t.Parallel()
	buildCheckout(t)
	sb := newUserSandbox(t, "readme-managed", "dockerd")
	sb.waitFor(t, "/run/docker.sock", 2*time.Minute)
	t.Cleanup(func() {
		// The plugin's embedded etcd and the containers die with the
		// sandbox's processes; removing the plugin first keeps dockerd's
		// shutdown quick.
		cmd := exec.Command("nsenter", "--net="+sb.host.NetnsPath, "--mount="+sb.mountNS, "--", "sh", "-c",
			"docker rm -f c1 c2 >/dev/null 2>&1; docker plugin disable -f calico >/dev/null 2>&1; docker plugin rm -f calico >/dev/null 2>&1; true")
		cmd.Env = []string{"PATH=/usr/bin:/usr/sbin:/bin:/sbin"}
		_ = cmd.Run()
	})
	text := sb.shell(t, readmeBlock(t, "managed-quickstart"), 6*time.Minute)
	if n := strings.Count(text, "2 packets transmitted, 2 packets received"); n != 2 {
		t.Errorf("want 2 successful pings (before and after the settings change), got %d", n)
	}
	if hostname, _ := os.Hostname(); !regexp.MustCompile(`(?m)\s` + regexp.QuoteMeta(hostname) + `\s+2\s+62$`).MatchString(text) {
		t.Errorf("ipam show does not list a block of host %s with 2 used", hostname)
	}
	if _, err := os.Stat(sb.path("/var/lib/calico-cnm/etcd")); err != nil {
		t.Errorf("the embedded etcd data is not in the state mount: %v", err)
	}
	if links, _ := sb.host.Exec(t, "ip", "-o", "link", "show"); strings.Contains(links, "cali") {
		t.Errorf("cali veths left after the quick start removed its containers:\n%s", links)
	}
}
