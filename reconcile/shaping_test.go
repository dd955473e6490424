package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/reconcile"
)

// countingShaping is a ShapingSyncer that reports fixed results.
type countingShaping struct {
	calls int
	fixes int
	err   error
}

func (c *countingShaping) Sync(ctx context.Context) (int, error) {
	c.calls++
	return c.fixes, c.err
}

// TestReconcilePassSyncsShaping: every reconcile pass, with Docker's view
// known or not, rebuilds the bandwidth shaping; its repairs are counted
// and its failure fails the pass.
func TestReconcilePassSyncsShaping(t *testing.T) {
	e := newRecEnv(t)
	shaping := &countingShaping{fixes: 2}
	e.rec.Shaping = shaping
	res := e.pass(t)
	if shaping.calls != 1 || res.Fixes[reconcile.FixShapingRepaired] != 2 {
		t.Fatalf("pass: %d Sync calls, fixes %v; want 1 call and 2 shaping repairs", shaping.calls, res.Fixes)
	}
	e.docker.mu.Lock()
	e.docker.err = errors.New("injected: Docker is down")
	e.docker.mu.Unlock()
	shaping.fixes, shaping.err = 0, errors.New("injected: netlink refused")
	if _, err := e.rec.Pass(context.Background()); err == nil || !strings.Contains(err.Error(), "bandwidth shaping: injected: netlink refused") {
		t.Fatalf("pass with a failing Sync: %v", err)
	}
	if shaping.calls != 2 {
		t.Errorf("Sync not called while Docker is unreachable (%d calls)", shaping.calls)
	}
	e.expectFixes(t, map[string]int{reconcile.FixShapingRepaired: 2})
}
