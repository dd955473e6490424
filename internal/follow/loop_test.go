package follow

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLoopWait: what wakes a pass, and that a burst of changes queued
// meanwhile is drained into it.
func TestLoopWait(t *testing.T) {
	errGaveUp := errors.New("syncer stopped")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		dirty   []string
		gaveUp  error
		resync  bool
		call    bool
		matters func(string) bool
		want    string
		wantErr error
	}{
		{name: "a change", dirty: []string{"nodes/", "pools/"}, want: "nodes/"},
		{name: "changes that do not matter wait for one that does", dirty: []string{"nodes/", "pools/"},
			matters: func(p string) bool { return p == "pools/" }, want: "pools/"},
		{name: "resync", resync: true, want: "resync"},
		{name: "a call runs on the loop", call: true, want: "call"},
		{name: "the follower gave up", gaveUp: errGaveUp, wantErr: errGaveUp},
		{name: "ctx ended", ctx: canceled, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			dirty := make(chan string, 4)
			for _, p := range tc.dirty {
				dirty <- p
			}
			gaveUp := make(chan error, 1)
			if tc.gaveUp != nil {
				gaveUp <- tc.gaveUp
			}
			resync := make(chan time.Time, 1)
			if tc.resync {
				resync <- time.Now()
			}
			calls := make(chan func(context.Context), 1)
			ran := false
			if tc.call {
				calls <- func(context.Context) { ran = true }
			}
			l := Loop{Matters: tc.matters, Calls: calls}
			cause, err := l.Wait(ctx, dirty, gaveUp, resync)
			if !errors.Is(err, tc.wantErr) || cause != tc.want {
				t.Fatalf("Wait = %q, %v; want %q, %v", cause, err, tc.want, tc.wantErr)
			}
			if ran != tc.call {
				t.Errorf("call ran: %v, want %v", ran, tc.call)
			}
			if err == nil && len(dirty) != 0 {
				t.Errorf("%d changes left queued, want them drained into the pass", len(dirty))
			}
		})
	}
}
