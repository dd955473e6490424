package wireguard

import (
	"context"
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
		stopFirst bool
	}{
		{"syncer stopped at the start", true},
		{"syncer stops while the manager runs", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newManagerFixture(t)
			records, stop := followtest.Stoppable(t, f.store)
			f.m.d.Records = blockRecords{Records: records, b: f.blocks}
			f.m.d.ResyncInterval = time.Hour
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := records.WaitRevision(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tc.stopFirst {
				stop()
			}
			done := make(chan error, 1)
			go func() { done <- f.m.Run(ctx) }()
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
