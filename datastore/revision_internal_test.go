package datastore

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestObserveOutOfOrderIsNoWipe: responses to requests in flight together
// arrive in any order; only a response below the revision seen before its
// request was sent means the store went back.
func TestObserveOutOfOrderIsNoWipe(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps [][2]int64 // begin, revision
		ended bool
	}{
		{"in order", [][2]int64{{0, 3}, {3, 4}}, false},
		{"out of order", [][2]int64{{0, 4}, {0, 3}}, false},
		{"went back", [][2]int64{{0, 40}, {40, 3}}, true},
		{"went back after out of order", [][2]int64{{0, 4}, {0, 3}, {4, 2}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{log: logrus.New()}
			wctx, release := s.watchContext(context.Background())
			defer release()
			for _, st := range tc.steps {
				s.observe(st[0], st[1])
			}
			if ended := wctx.Err() != nil; ended != tc.ended {
				t.Fatalf("watch ended = %v; want %v", ended, tc.ended)
			}
		})
	}
}
