package routing

import (
	"net/netip"
	"sync"
	"time"
)

// ribMirror is the speaker's learned paths as the agent last saw them,
// kept up to date from gobgp's adj-in events so that a pass does not list
// the whole RIB. Listing it ran on gobgp's server goroutine and converted
// every path, on every node, for every pass: at 64 nodes a burst of claims
// made that most of the CPU of the burst, taken from the route reflectors
// that had the updates to send.
//
// The events say what changed per (peer, prefix) but not what the session
// events do to paths (a graceful restart marks them stale, a session that
// ends drops them, a restart timer that expires removes the stale ones), so
// those make the next read list the RIB again (invalidate), as does age.
// A list and the events run concurrently: events applied while a list is
// in flight are replayed on top of it, in order, so a path learned after
// the list read the RIB is not lost with the older snapshot (and one
// already in it is just applied again). One reader at a time (the agent's
// pass): a second list in flight would take over the first one's replay.
type ribMirror struct {
	mu         sync.Mutex
	paths      map[ribKey]LearnedPath
	valid      bool      // paths can be served without listing
	listedAt   time.Time // when paths was last listed
	listing    bool      // a list is in flight: log events for replay
	replay     []ribEvent
	lists      int // how many times the RIB was listed (tests)
	maxListAge time.Duration
}

type ribKey struct {
	peer   netip.Addr
	prefix netip.Prefix
}

// ribEvent is one adj-in change: path replaces what peer sent for the
// prefix, or withdraws it.
type ribEvent struct {
	path     LearnedPath
	withdraw bool
}

func newRIBMirror(maxListAge time.Duration) *ribMirror {
	return &ribMirror{maxListAge: maxListAge}
}

// invalidate makes the next read list the RIB.
func (m *ribMirror) invalidate() {
	m.mu.Lock()
	m.valid = false
	m.mu.Unlock()
}

// apply records adj-in changes (or logs them while a list is in flight).
func (m *ribMirror) apply(evs []ribEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.listing {
		m.replay = append(m.replay, evs...)
		return
	}
	for _, ev := range evs {
		m.applyLocked(ev)
	}
}

func (m *ribMirror) applyLocked(ev ribEvent) {
	if m.paths == nil {
		return // nothing listed yet: the first read lists
	}
	k := ribKey{ev.path.Peer, ev.path.Prefix.Masked()}
	if ev.withdraw {
		delete(m.paths, k)
		return
	}
	m.paths[k] = ev.path
}

// read returns the paths, listing them with list when the mirror is not
// valid or too old.
func (m *ribMirror) read(list func() ([]LearnedPath, error)) ([]LearnedPath, error) {
	m.mu.Lock()
	if m.valid && time.Since(m.listedAt) < m.maxListAge {
		defer m.mu.Unlock()
		return m.snapshotLocked(), nil
	}
	m.listing, m.valid, m.replay = true, true, nil
	m.lists++
	m.mu.Unlock()

	listed, err := list()

	m.mu.Lock()
	defer m.mu.Unlock()
	m.listing = false
	if err != nil {
		m.valid, m.replay = false, nil
		return nil, err
	}
	m.paths, m.listedAt = make(map[ribKey]LearnedPath, len(listed)), time.Now()
	for _, p := range listed {
		m.applyLocked(ribEvent{path: p})
	}
	for _, ev := range m.replay {
		m.applyLocked(ev)
	}
	m.replay = nil
	return m.snapshotLocked(), nil
}

func (m *ribMirror) snapshotLocked() []LearnedPath {
	out := make([]LearnedPath, 0, len(m.paths))
	for _, p := range m.paths {
		out = append(out, p)
	}
	return out
}

// listCount is how many times the RIB was listed.
func (m *ribMirror) listCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lists
}
