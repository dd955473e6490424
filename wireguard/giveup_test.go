package wireguard

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
		f := newManagerFixture(t)
		return f.store, func(records *datastore.Syncer) followtest.Run {
			f.m.d.Records = blockRecords{Records: records, b: f.blocks}
			f.m.d.ResyncInterval = time.Hour
			return f.m.Run
		}
	})
}
