package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// PlotIPAMOwnedBlocks is the plot of an assignment's cost against the
// blocks its host owns.
const PlotIPAMOwnedBlocks = "IPAM: cost of one assignment by blocks owned"

// TargetOwnedBlocksRatio: an assignment in a host owning 100 blocks costs
// (in allocations, which the shared machine's load does not move) at most
// this much more than in a host owning 1.
const TargetOwnedBlocksRatio = 1.1

// ipamOwnedBlocksBench runs ipam.BenchmarkAutoAssignOwnedBlocks and adds the
// allocations per assignment with 1, 20 and 100 owned blocks, and the
// ratio 100 / 1 against its target.
func ipamOwnedBlocksBench(t *testing.T, res *Results) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkAutoAssignOwnedBlocks$", "-benchtime", "300x", "-benchmem", "-count", "1", "./ipam/")
	cmd.Dir = harness.ModuleRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ipam owned-blocks benchmark: %v\n%s", err, out)
	}
	if err := addOwnedBlocks(res, strings.NewReader(string(out))); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// addOwnedBlocks reads BenchmarkAutoAssignOwnedBlocks output into res.
func addOwnedBlocks(res *Results, in io.Reader) error {
	b, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	allocs := map[int]float64{}
	var blocks []float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[0], "BenchmarkAutoAssignOwnedBlocks/blocks=") {
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f[0], "BenchmarkAutoAssignOwnedBlocks/blocks="), "-", 2)[0])
		if err != nil {
			return fmt.Errorf("benchmark name %q: %w", f[0], err)
		}
		for i := 2; i+1 < len(f); i += 2 {
			if f[i+1] == "allocs/op" {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return fmt.Errorf("%s allocs/op %q: %w", f[0], f[i], err)
				}
				allocs[n] = v
				blocks = append(blocks, float64(n))
			}
		}
	}
	if allocs[1] == 0 || allocs[100] == 0 {
		return fmt.Errorf("no allocs/op for 1 and 100 owned blocks in the ipam benchmark output")
	}
	s := Series{Plot: PlotIPAMOwnedBlocks, Name: "allocations per assignment", XLabel: "blocks the host owns", YLabel: "allocs/op", Kind: Line}
	for _, n := range blocks {
		s.X, s.Y = append(s.X, n), append(s.Y, allocs[int(n)])
	}
	res.Add(s)
	res.Add(Series{Plot: PlotIPAMOwnedBlocks + " (100 / 1)", Name: "allocations, 100 blocks / 1 block", YLabel: "x", Y: []float64{allocs[100] / allocs[1]}, Kind: Bars, Target: TargetOwnedBlocksRatio})
	return nil
}
