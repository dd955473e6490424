package datastore

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWrapUnavailable: every way etcd says "not now" (the client's gRPC
// status, the server's own errors during a leader election) reads as
// ErrUnavailable, which Docker's users see as "datastore unreachable".
func TestWrapUnavailable(t *testing.T) {
	s := &Store{}
	tests := []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"grpc unavailable", status.Error(codes.Unavailable, "connection refused"), true},
		{"server request timed out (leader election)", rpctypes.ErrTimeout, true},
		{"server timed out due to leader failure", rpctypes.ErrTimeoutDueToLeaderFail, true},
		{"server has no leader", rpctypes.ErrNoLeader, true},
		{"leader changed", rpctypes.ErrLeaderChanged, true},
		{"wrapped", fmt.Errorf("txn: %w", rpctypes.ErrTimeout), true},
		{"key too large is not unavailability", rpctypes.ErrRequestTooLarge, false},
		{"compacted is not unavailability", rpctypes.ErrCompacted, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := errors.Is(s.wrap(tc.err), ErrUnavailable); got != tc.unavailable {
				t.Errorf("wrap(%v) is ErrUnavailable = %v, want %v (%v)", tc.err, got, tc.unavailable, s.wrap(tc.err))
			}
		})
	}
}
