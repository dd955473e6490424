package wireguard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
)

// TestManagerRunReturnsItsFailure: when the manager can no longer follow
// the datastore (its revision refused for good, at the start or after a
// watch broke), Run returns that failure for the daemon's supervisor
// instead of nil, or of going on while it hears of no change.
func TestManagerRunReturnsItsFailure(t *testing.T) {
	for _, tc := range []struct {
		name      string
		revisions int // revision reads answered before the refusal
	}{
		{"revision refused at the start", 0},
		{"revision refused after a watch broke", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newManagerFixture(t)
			f.m.d.Store = &followtest.Refusing{Store: f.store, Revisions: tc.revisions}
			f.m.d.ResyncInterval = time.Hour
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- f.m.Run(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, followtest.ErrRefused) {
					t.Fatalf("Run = %v, want %v", err, followtest.ErrRefused)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run went on while it follows the datastore no more")
			}
		})
	}
}
