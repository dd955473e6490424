package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// TestReadmeQuickStart pastes the README's quick start, as written, into a
// shell on a host where the daemon runs as `make run` runs it (embedded
// etcd, sockets where dockerd looks), and checks what the README promises.
func TestReadmeQuickStart(t *testing.T) {
	h := newCalicoHost(t, "readme")
	script := quickStart(t)

	// The user's working directory is a checkout with bin/calico-cnm built.
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(h.bin, filepath.Join(work, "bin", "calico-cnm")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(harness.ModuleRoot(t), "scripts"), filepath.Join(work, "scripts")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+h.NetnsPath, "--", "sh", "-ex", "-c", script)
	cmd.Dir = work
	cmd.Env = []string{
		"PATH=/usr/bin:/usr/sbin:/bin:/sbin",
		"DOCKER_HOST=" + h.DockerHost(),
		"DOCKER_CONFIG=" + t.TempDir(),
		"HOME=" + work,
	}
	done := make(chan struct{})
	var out []byte
	var err error
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
		t.Fatalf("quick start failed: %v", err)
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
	if !strings.Contains(text, fmt.Sprintf("%s ", h.Name)) {
		t.Errorf("ipam show does not list a block of host %s", h.Name)
	}
	if links := h.caliLinks(t); len(links) != 0 {
		t.Errorf("cali veths left after the quick start removed its containers: %v", links)
	}
}
