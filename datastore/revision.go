package datastore

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// revisionGuard notices the datastore's revision going back: the etcd
// behind the endpoints was wiped (or replaced) and restored. etcd never
// lowers its revision otherwise. Watches then wait for revisions the new
// store reaches late or never, so the guard ends them all: each watcher
// gets an error event and re-lists, as after any broken watch.
type revisionGuard struct {
	mu      sync.Mutex
	max     int64
	resets  int64 // times the revision went back
	nextID  int
	watches map[int]context.CancelFunc
}

// SeenRevision is the highest revision observed so far: a request sent
// after it must be answered at this revision or later. It is at least
// that of every write this process made, so a reader of the syncer's
// memory that needs only its own process's writes waits for it instead of
// asking etcd for its current revision (Revision), and so still works
// while etcd is unreachable.
func (s *Store) SeenRevision() int64 {
	g := &s.revs
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max
}

// RevisionResets counts the times this client saw the datastore's
// revision go back. What a reader keeps by ModRevision (a record it need not
// read again while its revision is unchanged) is void once this moves: a
// restored store reuses revisions for other contents.
func (s *Store) RevisionResets() int64 {
	g := &s.revs
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resets
}

// observe records the revision of a response to a request sent when
// SeenRevision was begin. Only a revision below begin is a store that went
// back: requests in flight together may be answered out of order, so a
// response below the highest revision seen since proves nothing.
func (s *Store) observe(begin, rev int64) {
	g := &s.revs
	g.mu.Lock()
	if rev >= begin {
		g.max = max(g.max, rev)
		g.mu.Unlock()
		return
	}
	old := g.max
	g.max = rev
	g.resets++
	cancels := g.watches
	g.watches = nil
	g.mu.Unlock()
	s.log.WithFields(logrus.Fields{"revision": rev, "before": old, "watches": len(cancels)}).
		Warn("the datastore's revision went back (etcd wiped and restored?): restarting every watch")
	for _, cancel := range cancels {
		cancel()
	}
}

// watchContext is a context for one watch that observe cancels when the
// revision goes back; release forgets it.
func (s *Store) watchContext(ctx context.Context) (wctx context.Context, release func()) {
	g := &s.revs
	wctx, cancel := context.WithCancel(ctx)
	g.mu.Lock()
	if g.watches == nil {
		g.watches = map[int]context.CancelFunc{}
	}
	id := g.nextID
	g.nextID++
	g.watches[id] = cancel
	g.mu.Unlock()
	return clientv3.WithRequireLeader(wctx), func() {
		g.mu.Lock()
		delete(g.watches, id)
		g.mu.Unlock()
		cancel()
	}
}
