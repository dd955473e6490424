package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUnreachableShapes: every shape in which a datastore failure reaches
// the drivers reads "datastore unreachable" and matches ErrUnavailable,
// both through Unreachable (the drivers' replies) and through Store.wrap
// (the store's own calls); a refusal or a cancelled request does not.
func TestUnreachableShapes(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: &net.OpError{Op: "read", Err: syscall.ECONNRESET}}
	tests := []struct {
		name        string
		err         error
		unreachable bool
	}{
		{"grpc Unknown: server context deadline (TestEtcdClusterLeaderFailure)", status.Error(codes.Unknown, "context deadline exceeded"), true},
		{"as main wrapped it: etcd: rpc error Unknown", fmt.Errorf("etcd: %w", status.Error(codes.Unknown, "context deadline exceeded")), true},
		{"grpc DeadlineExceeded", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true},
		{"grpc Unavailable", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:2379: connect: connection refused\""), true},
		{"context deadline", context.DeadlineExceeded, true},
		{"wrapped context deadline", fmt.Errorf("listing blocks: %w", context.DeadlineExceeded), true},
		{"connection reset", reset, true},
		{"bare ECONNRESET", syscall.ECONNRESET, true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"unexpected EOF", fmt.Errorf("reading reply: %w", io.ErrUnexpectedEOF), true},
		{"net timeout", &net.DNSError{Err: "i/o timeout", IsTimeout: true}, true},
		{"server request timed out (leader election)", rpctypes.ErrTimeout, true},
		{"server has no leader", rpctypes.ErrNoLeader, true},
		{"already classified", fmt.Errorf("%w: no answer from etcd within 10s", ErrUnavailable), true},
		{"cancelled is the caller giving up", context.Canceled, false},
		{"conflict", ErrConflict, false},
		{"not found", ErrNotFound, false},
		{"compacted", rpctypes.ErrCompacted, false},
		{"request too large", rpctypes.ErrRequestTooLarge, false},
		{"grpc InvalidArgument", status.Error(codes.InvalidArgument, "bad key"), false},
		{"plain error", errors.New("pool 10.0.0.0/24 overlaps"), false},
		{"nil", nil, false},
	}
	s := &Store{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsUnreachable(tc.err); got != tc.unreachable {
				t.Errorf("IsUnreachable(%v) = %v, want %v", tc.err, got, tc.unreachable)
			}
			for _, out := range []struct {
				via string
				err error
			}{{"Unreachable", Unreachable(tc.err)}, {"wrap", s.wrap(tc.err)}} {
				if tc.err == nil {
					if out.err != nil {
						t.Errorf("%s(nil) = %v", out.via, out.err)
					}
					continue
				}
				says := strings.Contains(out.err.Error(), "datastore unreachable")
				if errors.Is(out.err, ErrUnavailable) != tc.unreachable || says != tc.unreachable {
					t.Errorf("%s(%v) = %q: matches ErrUnavailable %v, says so %v; want %v",
						out.via, tc.err, out.err, errors.Is(out.err, ErrUnavailable), says, tc.unreachable)
				}
			}
			if !tc.unreachable && Unreachable(tc.err) != tc.err {
				t.Errorf("Unreachable changed a refusal: %v -> %v", tc.err, Unreachable(tc.err))
			}
		})
	}
}
