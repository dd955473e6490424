package ipam

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// readBackTimeout bounds settleAmbiguous's reads and release. When they
// do not finish in time (etcd really is down), the handle is released
// later (ReleaseAbandoned).
const readBackTimeout = 500 * time.Millisecond

// isAmbiguous tells a transaction failure after which etcd may or may not
// have applied the transaction: no answer in time, the connection lost, the
// request cancelled. A conflict or a refusal is a definite answer.
func isAmbiguous(err error) bool {
	return datastore.IsUnreachable(err) || errors.Is(err, context.Canceled)
}

// settleAmbiguous decides an assignment whose transaction failed
// ambiguously (err). Handles are unique per request, so a committed
// assignment nobody is told about is orphaned for good: the engine reads
// the block back and answers from what etcd holds. Landed and the caller
// still waiting: success. Landed but the caller gave up: the assignment is
// released (by handle, so only this request's address). Not landed: the
// failure stands. When etcd cannot be read either, the handle is
// remembered and ReleaseAbandoned releases it once etcd answers again.
func (e *Engine) settleAmbiguous(ctx context.Context, req assignReq, p netip.Prefix, ord int, err error) (netip.Addr, int64, error) {
	log := req.log.WithFields(logrus.Fields{"block": p.String(), "ip": nthAddr(p, ord).String()}).WithError(err)
	e.uncacheBlock(p)
	e.uncacheHandle(req.handle)
	// The transaction used up the caller's datastore budget already: the
	// read-back gets a short one of its own, so that a request still ends
	// about --etcd-timeout after it began even while etcd is down.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readBackTimeout)
	defer cancel()
	b, rev, exists, rerr := e.readBlock(rctx, p)
	if rerr != nil {
		e.abandon(req.handle)
		log.WithField("readBack", rerr.Error()).Warn("etcd did not answer an assignment and cannot be read back: answering failure; the assignment, if it landed, is released when etcd answers again")
		return netip.Addr{}, 0, err
	}
	// A claim that did not land leaves no block at all: b is nil then.
	if !exists || !b.heldBy(ord, req.handle) {
		log.Info("etcd did not answer an assignment, and it did not land: answering failure")
		return netip.Addr{}, 0, err
	}
	if ctx.Err() == nil {
		log.Info("etcd did not answer an assignment in time, but it had committed: answering success")
		return nthAddr(p, ord), rev, nil
	}
	if rerr := e.ReleaseByHandle(rctx, req.handle); rerr != nil {
		e.abandon(req.handle)
		log.WithField("release", rerr.Error()).Warn("the caller gave up on an assignment that committed, and releasing it failed: retrying when etcd answers again")
		return netip.Addr{}, 0, err
	}
	log.Info("the caller gave up on an assignment that committed: released it")
	return netip.Addr{}, 0, err
}

// abandon remembers a handle whose assignment was answered as failed but
// may have landed: nobody else knows the handle, so releasing it later is
// always safe.
func (e *Engine) abandon(handle string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.abandoned == nil {
		e.abandoned = map[string]bool{}
	}
	e.abandoned[handle] = true
}

// ReleaseAbandoned releases the handles of assignments that were answered
// as failed while etcd could not tell whether they landed (see
// settleAmbiguous). The daemon calls it on every reconcile pass, in every
// scope: it is how a swarm manager's timed-out assignment is swept. It
// returns how many handles it settled; those it cannot release yet stay.
func (e *Engine) ReleaseAbandoned(ctx context.Context) (int, error) {
	e.mu.Lock()
	handles := make([]string, 0, len(e.abandoned))
	for h := range e.abandoned {
		handles = append(handles, h)
	}
	e.mu.Unlock()
	var errs []error
	n := 0
	for _, h := range handles {
		if err := e.ReleaseByHandle(ctx, h); err != nil {
			errs = append(errs, err)
			continue
		}
		e.mu.Lock()
		delete(e.abandoned, h)
		e.mu.Unlock()
		n++
		e.log.WithField("handle", h).Info("released an assignment that was answered as failed while etcd did not answer")
	}
	return n, errors.Join(errs...)
}
