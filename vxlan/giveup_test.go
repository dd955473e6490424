package vxlan

import (
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
	followtest.RunGivesUp(t, func(t *testing.T) (*datastore.Store, followtest.NewRun) {
		store, eng, _, cancel, log := followtest.Fixture(t)
		t.Cleanup(cancel)
		return store, func(records *datastore.Syncer) followtest.Run {
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
