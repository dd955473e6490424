package routing

import (
	"net/netip"
	"slices"
	"time"
)

// Make before break. A topology change (mesh <-> route reflectors, a
// reflector added or removed, a peer's password rotated) changes sessions
// on every node at about the same moment, but each node sees the change,
// and each new session comes up, at its own pace. Closing the old sessions
// first (what gobgp does on DeletePeer: a Cease, after which the peer drops
// every route at once, graceful restart or not) left every node without
// learned routes until the new sessions had carried them again. So:
//
//   - a session that is no longer wanted but whose peer still exists is
//     retired, not removed: it stays up until every route it brought in is
//     also brought in by a session that stays (the reflector's copy of a
//     mesh peer's block, say), then it is removed;
//   - a session whose settings need a new connection (password, reflector
//     client flag, AS) is re-created at once, and like every session added
//     by the change it is pending until it is Established and has sent its
//     End-of-RIB;
//   - while anything is retiring or pending, learned kernel routes are
//     updated and added but never deleted (as after a restart, before
//     every peer's End-of-RIB): a route that a session is about to bring
//     back stays installed meanwhile;
//   - both end after Config.SyncTimeout at the latest, so a peer that never
//     comes up cannot freeze deletions.
//
// A session whose peer is gone altogether (node deleted, peer record
// removed) is removed at once and its routes go: there is nothing to wait
// for, and `node delete` promises exactly that.

// peerPlan is what syncPeers does to the speaker's sessions, in order:
// add and re-create first, then remove; retire keeps a session for now.
type peerPlan struct {
	Add     []PeerSpec   // new address
	Rekey   []PeerSpec   // same address, the session must be re-created
	Relabel []PeerSpec   // same session, only how we describe it changed
	Retire  []netip.Addr // unwanted, peer still exists: keep until replaced
	Remove  []netip.Addr // unwanted, peer gone: remove now
}

// sameSession: the speaker would set up the same session for both (the
// type and name are only labels: a mesh peer that becomes our reflector
// is the same plain iBGP session on our side).
func (p PeerSpec) sameSession(o PeerSpec) bool {
	p.Type, o.Type = "", ""
	p.Name, o.Name = "", ""
	p.PasswordSecret, o.PasswordSecret = "", ""
	return p.Equal(o)
}

// planPeers compares the configured sessions with the wanted ones. exists
// holds every address that still belongs to a node or a peer record.
func planPeers(current map[netip.Addr]PeerSpec, want []PeerSpec, exists map[netip.Addr]bool) peerPlan {
	var plan peerPlan
	wanted := map[netip.Addr]bool{}
	for _, w := range want {
		wanted[w.Address] = true
		cur, ok := current[w.Address]
		switch {
		case !ok:
			plan.Add = append(plan.Add, w)
		case !cur.sameSession(w):
			plan.Rekey = append(plan.Rekey, w)
		case !cur.Equal(w):
			plan.Relabel = append(plan.Relabel, w)
		}
	}
	for addr := range current {
		if wanted[addr] {
			continue
		}
		if exists[addr] {
			plan.Retire = append(plan.Retire, addr)
		} else {
			plan.Remove = append(plan.Remove, addr)
		}
	}
	slices.SortFunc(plan.Retire, netip.Addr.Compare)
	slices.SortFunc(plan.Remove, netip.Addr.Compare)
	return plan
}

// owedRoute is a route a retiring session brought in.
type owedRoute struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
}

// retiree is a retiring session: since when, and every route it has
// brought in since (remembered, so that a route it stops carrying because
// the peer closed first is still owed by someone else).
type retiree struct {
	since time.Time
	owed  map[owedRoute]bool
}

// handover is the make-before-break state of the agent.
type handover struct {
	pending  map[netip.Addr]time.Time // added or re-created sessions, until synced
	retiring map[netip.Addr]*retiree
}

func newHandover() handover {
	return handover{pending: map[netip.Addr]time.Time{}, retiring: map[netip.Addr]*retiree{}}
}

// idle: no change in flight, deleting kernel routes is safe.
func (h handover) idle() bool { return len(h.pending) == 0 && len(h.retiring) == 0 }

// retire starts retiring addr (a no-op when it already is).
func (h handover) retire(addr netip.Addr, now time.Time) {
	if h.retiring[addr] == nil {
		h.retiring[addr] = &retiree{since: now, owed: map[owedRoute]bool{}}
	}
}

// forget drops addr from both sets (wanted again, or removed).
func (h handover) forget(addr netip.Addr) {
	delete(h.pending, addr)
	delete(h.retiring, addr)
}

// handoverStep is what the agent should do after looking at the RIB.
type handoverStep struct {
	Remove   []netip.Addr // retired sessions whose routes others now carry
	TimedOut []netip.Addr // retired or pending sessions given up on
	Synced   []netip.Addr // pending sessions now Established with End-of-RIB
}

// advance records what the retiring sessions carry and decides which of
// them can go, and which pending sessions are done. paths are all learned
// paths, accept is the import policy's verdict on one.
func (h handover) advance(paths []LearnedPath, accept func(LearnedPath) bool, states []PeerState, now time.Time, timeout time.Duration) handoverStep {
	var step handoverStep
	byAddr := map[netip.Addr]PeerState{}
	for _, s := range states {
		byAddr[s.Address] = s
	}
	for addr, since := range h.pending {
		s := byAddr[addr]
		switch {
		case s.State == "Established" && s.EORReceived:
			step.Synced = append(step.Synced, addr)
		case now.Sub(since) > timeout:
			step.TimedOut = append(step.TimedOut, addr)
		}
	}
	// What the sessions that stay carry, and what each retiring one does.
	carried := map[owedRoute]bool{}
	for _, p := range paths {
		if !accept(p) {
			continue
		}
		r := owedRoute{Prefix: p.Prefix.Masked(), NextHop: p.NextHop}
		if ret := h.retiring[p.Peer]; ret != nil {
			ret.owed[r] = true
			continue
		}
		carried[r] = true
	}
	for addr, ret := range h.retiring {
		if now.Sub(ret.since) > timeout {
			step.TimedOut = append(step.TimedOut, addr)
			continue
		}
		done := true
		for r := range ret.owed {
			if !carried[r] {
				done = false
				break
			}
		}
		if done {
			step.Remove = append(step.Remove, addr)
		}
	}
	for _, l := range [][]netip.Addr{step.Remove, step.TimedOut, step.Synced} {
		slices.SortFunc(l, netip.Addr.Compare)
	}
	return step
}
