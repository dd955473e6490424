package vxlan

import (
	"context"
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
	followtest.RunGivesUp(t, func(t *testing.T) (*datastore.Store, func(*datastore.Syncer) func(context.Context) error) {
		store, eng, _, cancel, log := newFixture(t)
		t.Cleanup(cancel)
		return store, func(records *datastore.Syncer) func(context.Context) error {
			m, err := NewManager(Deps{
				Store: store, Records: records, Blocks: eng,
				Kernel: newFakeVXLANKernel(), NodeName: "a", Log: log, ResyncInterval: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			return m.Run
		}
	})
}
