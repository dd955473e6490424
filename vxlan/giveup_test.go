package vxlan

import (
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
			store, eng, ctx, cancel, log := newFixture(t)
			defer cancel()
			m, err := NewManager(Deps{
				Store: &followtest.Refusing{Store: store, Revisions: tc.revisions}, Blocks: eng,
				Kernel: newFakeVXLANKernel(), NodeName: "a", Log: log, ResyncInterval: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
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
