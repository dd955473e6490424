package plugin

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// idleStore is a datastore with no endpoint: it counts listings and
// fails what the idle learner must not do.
type idleStore struct {
	lists, reads atomic.Int32
}

func (s *idleStore) GetJSON(ctx context.Context, key string, out any) (int64, error) {
	s.reads.Add(1)
	return 0, datastore.ErrNotFound
}

func (s *idleStore) List(ctx context.Context, prefix string) ([]datastore.KV, error) {
	s.lists.Add(1)
	return nil, nil
}

func (s *idleStore) Txn(ctx context.Context, ops ...datastore.Op) error {
	return errors.New("idleStore: no write expected")
}

func (s *idleStore) Retry(ctx context.Context, fn func(ctx context.Context) error) error {
	return fn(ctx)
}

// Issue 20 item 6: at idle the learner asks neither Docker nor the
// datastore anything. In a bubble whose clock jumps an hour once every
// goroutine is blocked: after the start's listings, no call at all.
func TestLabelLearnerIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fd, store := newFakeDocker(), &idleStore{}
		runLearner(t, fd, store)
		synctest.Wait()
		lists0, inspects0, streams0 := fd.counts()
		if lists0 != 1 || store.lists.Load() != 1 {
			t.Fatalf("start: %d Docker listings, %d datastore listings; want 1, 1", lists0, store.lists.Load())
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		lists, inspects, streams := fd.counts()
		if lists != lists0 || inspects != inspects0 || streams != streams0 || store.lists.Load() != 1 || store.reads.Load() != 0 {
			t.Errorf("an idle hour: Docker listings %d -> %d, inspects %d -> %d, streams %d -> %d, datastore listings 1 -> %d, reads %d; want no call",
				lists0, lists, inspects0, inspects, streams0, streams, store.lists.Load(), store.reads.Load())
		}
	})
}

// A stream that breaks as soon as it is open is reopened (and Docker
// listed) ever more slowly: the backoff starts over only after a live
// event or a stream that stayed up.
func TestLabelLearnerFlappingStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fd := newFakeDocker()
		runLearner(t, fd, &idleStore{})
		const flaps = 6
		for i := 1; i <= flaps; i++ {
			synctest.Wait()
			fd.mu.Lock()
			fd.errs[i-1] <- errors.New("injected: the stream broke")
			fd.mu.Unlock()
			for _, _, streams := fd.counts(); streams <= i; _, _, streams = fd.counts() {
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
			}
		}
		fd.mu.Lock()
		defer fd.mu.Unlock()
		if len(fd.listTimes) != flaps+1 {
			t.Fatalf("%d listings, want %d", len(fd.listTimes), flaps+1)
		}
		// The sixth wait is 3.2 s ± 50% (it would be 200 ms ± 50% had
		// each listing started the backoff over).
		if gap := fd.listTimes[flaps].Sub(fd.listTimes[flaps-1]); gap < time.Second {
			t.Errorf("listings of a stream broken %d times in a row: the last %v apart, want the backoff grown past 1s (%v)", flaps, gap, fd.listTimes)
		}
	})
}
