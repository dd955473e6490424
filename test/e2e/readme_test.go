package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// quickStart returns the README's quick start block, as a user would paste it.
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	begin := strings.Index(s, "<!-- quickstart:begin -->")
	end := strings.Index(s, "<!-- quickstart:end -->")
	if begin < 0 || end < begin {
		t.Fatal("README.md has no quickstart:begin/end markers")
	}
	block := s[begin:end]
	start := strings.Index(block, "```sh\n")
	stop := strings.LastIndex(block, "```")
	if start < 0 || stop <= start {
		t.Fatal("quick start has no ```sh block")
	}
	return block[start+len("```sh\n") : stop]
}

// TestReadmeQuickStart runs the README's two promises together: `make run`
// as written (it starts dockerd, since none answers, and the daemon on its
// embedded etcd with the default socket dir), then the quick start pasted
// into a shell. Both run in a throw-away netns and a private mount namespace
// whose /run, /var/lib/docker, /var/lib/calico-cnm and /var/log are the
// test's own, so nothing of the machine's is touched.
func TestReadmeQuickStart(t *testing.T) {
	harness.RequirePrereqs(t)
	root := harness.ModuleRoot(t)
	h := harness.NewFabric(t, "").AddHost(t, "readme", harness.HostOptions{NoDockerd: true})
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	gocache, _ := exec.Command(goBin, "env", "GOCACHE").Output()
	gomodcache, _ := exec.Command(goBin, "env", "GOMODCACHE").Output()
	dirs := t.TempDir()
	var mounts []string
	for _, d := range []string{"/var/lib/docker", "/var/lib/calico-cnm", "/var/log"} {
		src := filepath.Join(dirs, strings.ReplaceAll(strings.TrimPrefix(d, "/"), "/", "_"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", d, src, d))
	}
	wrapper := "set -e; mount -t tmpfs tmpfs /run; " + strings.Join(mounts, "; ") + "; cd " + root + " && exec make run"
	env := []string{
		"PATH=" + filepath.Dir(goBin) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"GOCACHE=" + strings.TrimSpace(string(gocache)),
		"GOMODCACHE=" + strings.TrimSpace(string(gomodcache)),
		"DOCKER_HOST=", // make run talks to the default socket, as a user's shell does
	}
	mk := h.StartProcess(t, "make-run", env, nil, "unshare", "-m", "--propagation", "private", "sh", "-c", wrapper)
	mountNS := fmt.Sprintf("/proc/%d/ns/mnt", mk.Pid())
	sock := fmt.Sprintf("/proc/%d/root/run/docker/plugins/calico-ipam.sock", mk.Pid())
	harness.Eventually(t, 4*time.Minute, 500*time.Millisecond, "make run serving its sockets", func() error {
		if mk.Exited() {
			return fmt.Errorf("make run exited: %v\n%s", mk.ExitErr(), mk.LogTail(30))
		}
		_, err := os.Stat(sock)
		return err
	})
	t.Logf("make run is serving (log %s)", mk.Log())

	cmd := exec.Command("nsenter", "--net="+h.NetnsPath, "--mount="+mountNS, "--wd="+root, "--", "sh", "-ex", "-c", quickStart(t))
	cmd.Dir = root
	cmd.Env = []string{"PATH=/usr/bin:/usr/sbin:/bin:/sbin", "HOME=" + dirs, "DOCKER_CONFIG=" + t.TempDir()}
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("quick start did not finish in 3 minutes:\n%s", out)
	}
	t.Logf("quick start output:\n%s", out)
	if err != nil {
		t.Fatalf("quick start failed: %v\nmake run log:\n%s", err, mk.LogTail(40))
	}
	text := string(out)
	for _, want := range []string{
		"default via 169.254.1.1 dev eth0",
		"2 packets transmitted, 2 packets received",
		"blackhole 192.168.",
		"192.168.0.77/32",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("quick start output lacks %q", want)
		}
	}
	// make run names the node after the hostname, as a user's daemon does.
	if hostname, _ := os.Hostname(); !regexp.MustCompile(`(?m)^192\.168\.\S+/26\s+192\.168\.0\.0/16\s+` + regexp.QuoteMeta(hostname) + `\s+2\s+62$`).MatchString(text) {
		t.Errorf("ipam show does not list a block of host %s with 2 used, 62 free", hostname)
	}
	if links, _ := h.Exec(t, "ip", "-o", "link", "show"); strings.Contains(links, "cali") {
		t.Errorf("cali veths left after the quick start removed its containers:\n%s", links)
	}
}
