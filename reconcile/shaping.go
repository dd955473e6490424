package reconcile

import (
	"context"
	"fmt"
)

// ShapingSyncer is the reconcile pass's hook into bandwidth shaping
// (*bandwidth.Manager): it rebuilds the limits of the joined endpoints
// from their records and removes what no endpoint needs.
type ShapingSyncer interface {
	Sync(ctx context.Context) (fixes int, err error)
}

// syncShaping runs the shaping part of a reconcile pass.
func (r *Reconciler) syncShaping(ctx context.Context, fixes map[string]int) error {
	if r.Shaping == nil {
		return nil
	}
	n, err := r.Shaping.Sync(ctx)
	if n > 0 {
		fixes[FixShapingRepaired] += n
	}
	if err != nil {
		return fmt.Errorf("bandwidth shaping: %w", err)
	}
	return nil
}
