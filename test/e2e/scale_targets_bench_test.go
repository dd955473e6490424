package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/bench"
)

// TestScaleTargetsReachTheReport: the file BenchmarkBGPScale writes for
// CNM_BGP_SCALE_TARGETS becomes rows of the report's targets panel: the
// median run's time to every route for each row with a target (2 s) and,
// for the mesh, its ratio to gobgpd (2x), each judged; a row without a
// target adds nothing. No network: the rows are made up.
func TestScaleTargetsReachTheReport(t *testing.T) {
	t.Parallel()
	runs := func(routes ...time.Duration) []scaleResult {
		var out []scaleResult
		for _, r := range routes {
			out = append(out, scaleResult{routes: r, claimed: 100 * time.Millisecond})
		}
		return out
	}
	rows := []scaleRow{
		{nodes: 8, topo: scaleTopology{"mesh", 0}, cnm: runs(150 * time.Millisecond), base: runs(50 * time.Millisecond)},
		{nodes: 32, topo: scaleTopology{"mesh", 0}, cnm: runs(3100*time.Millisecond, 1400*time.Millisecond, 1500*time.Millisecond), base: runs(500 * time.Millisecond)},
		{nodes: 64, topo: scaleTopology{"rr2", 2}, cnm: runs(2500 * time.Millisecond), base: runs(2 * time.Second)},
	}
	path := filepath.Join(t.TempDir(), "scale-bench.txt")
	writeScaleTargets(t, path, rows)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var res bench.Results
	if err := res.AddBenchOutput(f, path); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range res.Goals() {
		got = append(got, fmt.Sprintf("%s %.2f %s %.0f %v", g.Name, g.Value, g.Unit, g.Target, g.Met()))
	}
	want := []string{
		"BGPScale32HostsMesh (s): routes 1.50 s 2 true",
		"BGPScale32HostsMesh (x): vs-gobgpd 3.00 x 2 false",
		"BGPScale64Hosts2Reflectors (s): routes 2.50 s 2 false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("targets from %s:\n%s\nwant:\n%s", path, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
