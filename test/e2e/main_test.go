// Package e2e holds the end-to-end tests of calico-cnm: real dockerd engines,
// each in its own network namespace (see package harness), and the real
// daemon. Run as root: go test ./test/e2e/... -count=1 -v -timeout 10m
// Without root, dockerd, the docker CLI or busybox the tests skip loudly.
package e2e

import (
	"os"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestMain builds calico-cnm once before the tests (as root, where they
// run; see harness.PrebuildBinary), sweeps what crashed earlier runs left
// behind and, after the tests, removes the process-wide temp files. Keep
// the only TestMain of package e2e here.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		harness.PrebuildBinary()
	}
	os.Exit(harness.Main(m))
}
