package vxlan

import (
	"errors"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
)

// TestManagerRunReturnsItsFailure: when the manager can no longer follow
// the datastore (its syncer stopped, before it started or while it ran),
// Run returns that failure for the daemon's supervisor instead of nil, or
// of going on while it hears of no change.
func TestManagerRunReturnsItsFailure(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stopFirst bool // the syncer stops before the manager runs
	}{
		{"syncer stopped at the start", true},
		{"syncer stops while the manager runs", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, eng, ctx, cancel, log := newFixture(t)
			defer cancel()
			records, stop := followtest.Stoppable(t, store)
			if err := records.WaitRevision(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tc.stopFirst {
				stop()
			}
			m, err := NewManager(Deps{
				Store: store, Records: records, Blocks: eng,
				Kernel: newFakeVXLANKernel(), NodeName: "a", Log: log, ResyncInterval: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			stop()
			select {
			case err := <-done:
				if !errors.Is(err, datastore.ErrSyncerStopped) {
					t.Fatalf("Run = %v, want %v", err, datastore.ErrSyncerStopped)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run went on while it follows the datastore no more")
			}
		})
	}
}
