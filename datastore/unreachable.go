package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unreachableCodes are the gRPC codes with which etcd (client or server)
// says "no answer now" rather than "no": Unavailable and DeadlineExceeded
// from the client's transport, and Unknown, which is what a member returns
// when its own request context ran out ("rpc error: code = Unknown desc =
// context deadline exceeded", seen under load and during elections).
var unreachableCodes = [...]codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Unknown}

func isUnreachableCode(c codes.Code) bool {
	for _, u := range unreachableCodes {
		if c == u {
			return true
		}
	}
	return false
}

// IsUnreachable is the one classification of datastore failures: true when
// err means etcd did not answer (down, partitioned, overloaded, electing a
// leader, the connection reset, a deadline passed) rather than answered
// with a refusal (conflict, not found, too large, compacted). A cancelled
// request is not unreachability: the caller gave up, etcd may be fine.
func IsUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// The client turns the server's own errors (a member that lost its
	// leader, "etcdserver: request timed out") into EtcdError, which
	// carries its gRPC code but no status.
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return isUnreachableCode(ee.Code())
	}
	if st, ok := status.FromError(err); ok {
		return isUnreachableCode(st.Code())
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Unreachable returns err so that it says "datastore unreachable" and
// matches ErrUnavailable when IsUnreachable classifies it so; any other
// error (nil included) is returned as it is. Every error a driver hands to
// Docker goes through it, so a user sees one wording for one condition
// whatever layer noticed it.
func Unreachable(err error) error {
	if !IsUnreachable(err) || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
