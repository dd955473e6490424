package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBackoffJitterAndBound: every delay lies within ±Jitter of the
// nominal doubling schedule, never beyond Max's jittered bound, and Reset
// starts over.
func TestBackoffJitterAndBound(t *testing.T) {
	p := Policy{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	b := New(p)
	nominal := p.Initial
	distinct := map[time.Duration]bool{}
	for i := range 12 {
		d := b.Next()
		lo, hi := time.Duration(float64(nominal)*(1-Jitter)), time.Duration(float64(nominal)*(1+Jitter))
		if d < lo || d > hi {
			t.Errorf("delay %d = %s, want within [%s, %s]", i, d, lo, hi)
		}
		distinct[d] = true
		nominal = min(2*nominal, p.Max)
	}
	if len(distinct) < 6 {
		t.Errorf("only %d distinct delays in 12: no jitter?", len(distinct))
	}
	b.Reset()
	if d := b.Next(); d > time.Duration(float64(p.Initial)*(1+Jitter)) {
		t.Errorf("after Reset the delay is %s, want about %s", d, p.Initial)
	}
}

func TestUntil(t *testing.T) {
	fast := Policy{Initial: time.Microsecond, Max: time.Millisecond}
	errBusy, errBad := errors.New("busy"), errors.New("bad")
	tests := []struct {
		name      string
		maxTries  uint
		failFirst int   // attempts that fail with errBusy
		then      error // what the attempt after them returns
		wantCalls int
		wantErr   error
	}{
		{"succeeds after failures", 0, 3, nil, 4, nil},
		{"permanent error stops at once", 0, 1, Permanent(errBad), 2, errBad},
		{"bounded tries give the last error", 5, 100, nil, 5, errBusy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls, notified := 0, 0
			err := Until(context.Background(), fast, tc.maxTries, func(context.Context) error {
				calls++
				if calls <= tc.failFirst {
					return errBusy
				}
				return tc.then
			}, func(error, time.Duration) { notified++ })
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", calls, tc.wantCalls)
			}
			if notified != min(calls-1, tc.failFirst) {
				t.Errorf("notified %d times for %d calls", notified, calls)
			}
		})
	}
}

// TestUntilStopsWithContext: a cancelled context ends the waiting.
func TestUntilStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Until(ctx, Policy{Initial: time.Hour, Max: time.Hour}, 0, func(context.Context) error {
		calls++
		cancel()
		return errors.New("down")
	}, nil)
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("err = %v after %d calls, want context.Canceled after 1", err, calls)
	}
	b := New(Policy{Initial: time.Hour, Max: time.Hour})
	if b.Wait(ctx) {
		t.Error("Wait on a cancelled context returned true")
	}
}
