package await

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// counter is state another goroutine advances, announcing each step.
type counter struct {
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func (c *counter) inc() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *counter) reaches(n int, stop error) func() (bool, <-chan struct{}, error) {
	return func() (bool, <-chan struct{}, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.n >= n {
			return true, nil, nil
		}
		return false, c.changed, stop
	}
}

func TestUntil(t *testing.T) {
	errStopped := errors.New("stopped")
	for _, tc := range []struct {
		name     string
		target   int
		stop     error
		canceled bool
		want     error
	}{
		{"already there", 0, nil, false, nil},
		{"reached after changes", 3, nil, false, nil},
		{"check fails", 3, errStopped, false, errStopped},
		{"ctx ends first", 1 << 30, nil, true, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &counter{changed: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.canceled {
				cancel()
			}
			done := make(chan error, 1)
			go func() { done <- Until(ctx, c.reaches(tc.target, tc.stop)) }()
			if !tc.canceled && tc.stop == nil {
				for range tc.target {
					c.inc()
				}
			}
			if err := <-done; !errors.Is(err, tc.want) {
				t.Fatalf("Until = %v, want %v", err, tc.want)
			}
		})
	}
}
