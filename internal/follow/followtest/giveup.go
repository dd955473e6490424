package followtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Run is a manager's Run.
type Run = func(ctx context.Context) error

// NewRun makes a manager's Run over the syncer it is to follow.
type NewRun = func(records *datastore.Syncer) Run

// RunGivesUp checks that a manager's Run returns datastore.ErrSyncerStopped
// when the syncer it follows stops, before Run starts or while it runs,
// instead of returning nil (the daemon's supervisor would not hear of it)
// or going on while it hears of no change. setup gives, for each case, the
// store to run the syncer over and what makes the manager's Run from that
// syncer.
func RunGivesUp(t *testing.T, setup func(t *testing.T) (*datastore.Store, NewRun)) {
	t.Helper()
	for _, tc := range []struct {
		name      string
		stopFirst bool // the syncer stops before the manager runs
	}{
		{"syncer stopped at the start", true},
		{"syncer stops while the manager runs", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, newRun := setup(t)
			records, stop := Stoppable(t, store)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := records.WaitRevision(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tc.stopFirst {
				stop()
			}
			run := newRun(records)
			done := make(chan error, 1)
			go func() { done <- run(ctx) }()
			stop()
			ExpectReturn(t, done, datastore.ErrSyncerStopped, "Run went on while it follows the datastore no more")
		})
	}
}

// ExpectReturn fails t unless done yields an error that is want within
// 10 s; otherwise it fails with stuck.
func ExpectReturn(t testing.TB, done <-chan error, want error, stuck string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, want) {
			t.Fatalf("Run = %v, want %v", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
	}
}
