package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestREADMEDriverOptLabels runs the README's driver-option labels example
// as printed (`busybox` is the harness image, `calico-cnm` the built CLI
// on the test's etcd): the endpoint gets the label given with `docker run
// --network name=...,driver-opt=...`, and after a reconnect the one given
// with `docker network connect --driver-opt`.
func TestREADMEDriverOptLabels(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	h := c.addHostOn(t, c.fabric, "a")
	h.MustDocker(t, "tag", harness.Image, "busybox")
	bin := t.TempDir()
	if err := os.Symlink(c.bin, filepath.Join(bin, "calico-cnm")); err != nil {
		t.Fatal(err)
	}
	block := readmeBlock(t, "driver-opt-labels")
	out, err := h.Exec(t, "env", "DOCKER_HOST="+h.DockerHost(), "ETCD_ENDPOINTS="+c.etcd, "PATH="+bin+":/usr/sbin:/usr/bin:/sbin:/bin", "sh", "-exc", block)
	if err != nil {
		t.Fatalf("README block: %v\n%s", err, out)
	}
	// Each `get endpoints -o wide` shows web1's endpoint with its label.
	lists := regexp.MustCompile(`(?m)^.*\bweb1\b.*$`).FindAllString(out, -1)
	if len(lists) != 2 || !strings.Contains(lists[0], "role=web") || !strings.Contains(lists[1], "role=api") || strings.Contains(lists[1], "role=web") {
		t.Errorf("want web1 with role=web, then role=api; got %q\n%s", lists, out)
	}
}
