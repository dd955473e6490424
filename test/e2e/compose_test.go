package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// composeFile is the usual front/back layout: web on both networks, db on
// back only, proxy on front only, each network with its own subnet.
const composeFile = `version: "2.4"
services:
  proxy:
    image: bb
    command: sleep 3600
    networks: [front]
  web:
    image: bb
    command: sleep 3600
    networks: [front, back]
  db:
    image: bb
    command: sleep 3600
    networks: [back]
networks:
  front:
    driver: calico
    ipam:
      driver: calico-ipam
      config:
        - subnet: 192.168.50.0/24
  back:
    driver: calico
    ipam:
      driver: calico-ipam
      config:
        - subnet: 192.168.60.0/24
`

// TestCompose: Debian's docker-compose (v1) brings up services on two
// calico networks; they reach each other by service name on the networks
// they share (web both, proxy and db only through web), and down removes
// everything.
func TestCompose(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	harness.RequireFile(t, "/usr/bin/docker-compose", "docker-compose (Debian package docker-compose)")
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, "compose", harness.HostOptions{})
	h.ImportBusybox(t)
	h.StartPlugin(t, bin, nil)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 60)
		}
	})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "docker-compose.yml"), []byte(composeFile), 0o644); err != nil {
		t.Fatal(err)
	}
	compose := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/usr/bin/docker-compose", append([]string{"-p", "cnm"}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "DOCKER_HOST=" + h.DockerHost(), "HOME=" + dir, "DOCKER_CONFIG=" + dir}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = compose("down", "--remove-orphans") })
	if out, err := compose("up", "-d"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	ping := func(from, to string, want bool) {
		t.Helper()
		if !want {
			if out, err := h.Docker(t, "exec", "cnm_"+from+"_1", "ping", "-c", "1", "-W", "1", to); err == nil {
				t.Errorf("%s reaches %s:\n%s", from, to, out)
			}
			return
		}
		harness.Eventually(t, 10*time.Second, 200*time.Millisecond, fmt.Sprintf("%s pings %s by name", from, to), func() error {
			out, err := h.Docker(t, "exec", "cnm_"+from+"_1", "ping", "-c", "1", "-W", "1", to)
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	ping("web", "db", true)
	ping("web", "proxy", true)
	ping("proxy", "web", true)
	ping("db", "web", true)
	ping("proxy", "db", false) // no common network: the name does not resolve
	if out, err := compose("down"); err != nil {
		t.Fatalf("docker-compose down: %v\n%s", err, out)
	}
	if links := h.MustExec(t, "ip", "-o", "link", "show"); strings.Contains(links, ": cali") {
		t.Errorf("veths left after docker-compose down:\n%s", links)
	}
}
