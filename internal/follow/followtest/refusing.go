// Package followtest has a datastore for tests of the managers that
// follow the datastore (package follow): one that stops answering for
// good.
package followtest

import (
	"context"
	"errors"
	"sync"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow"
	"github.com/calico-cnm/calico-cnm/internal/retry"
)

// ErrRefused is the failure a Refusing store gives for good.
var ErrRefused = errors.New("the datastore refuses this client for good")

// Refusing is Store, except that after Revisions reads of the datastore
// revision (follow.Revision) every further one fails for good
// (retry.Permanent(ErrRefused)), and every watch breaks at once: a
// follower cannot follow it.
type Refusing struct {
	follow.Store

	mu        sync.Mutex
	Revisions int
}

// ListWithRevision counts the revision reads (those of BGPConfigKey, see
// follow.Revision) and refuses them once Revisions is spent.
func (s *Refusing) ListWithRevision(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if prefix == datastore.BGPConfigKey {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.Revisions <= 0 {
			return nil, 0, retry.Permanent(ErrRefused)
		}
		s.Revisions--
	}
	return s.Store.ListWithRevision(ctx, prefix)
}

// Watch breaks at once.
func (s *Refusing) Watch(context.Context, string, int64) <-chan datastore.Event {
	out := make(chan datastore.Event, 1)
	out <- datastore.Event{Err: errors.New("watch broken")}
	close(out)
	return out
}
