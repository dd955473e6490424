// Package retry is the project's one retry policy: exponential backoff with
// jitter (github.com/cenkalti/backoff/v5), doubling from an initial delay to
// a bound. Jitter keeps the hosts of a cluster that lost the same dependency
// (etcd, dockerd) from retrying in lockstep.
package retry

import (
	"context"
	"errors"
	"time"

	cb "github.com/cenkalti/backoff/v5"
)

// Policy is a schedule: Initial doubling to Max, each delay drawn within
// ±Jitter of the nominal one.
type Policy struct {
	Initial, Max time.Duration
}

// Jitter is the randomization factor of every delay (0.5: 1 s is 0.5-1.5 s).
const Jitter = 0.5

// Standard waits on a dependency that is down or not up yet (etcd, dockerd,
// a port held by a dying predecessor): 200 ms doubling to 10 s.
func Standard() Policy { return Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second} }

// Conflict spreads hosts that lost an optimistic-concurrency race for the
// same record: 1 ms doubling to 25 ms.
func Conflict() Policy { return Policy{Initial: time.Millisecond, Max: 25 * time.Millisecond} }

// Backoff is one loop's position in its policy. Not safe for concurrent use.
type Backoff struct {
	b *cb.ExponentialBackOff
}

// New starts at the policy's first delay.
func New(p Policy) *Backoff {
	b := &cb.ExponentialBackOff{InitialInterval: p.Initial, RandomizationFactor: Jitter, Multiplier: 2, MaxInterval: p.Max}
	b.Reset()
	return &Backoff{b: b}
}

// Next is the delay before the next attempt; each call moves one step on.
func (b *Backoff) Next() time.Duration { return b.b.NextBackOff() }

// Reset starts over (after a success).
func (b *Backoff) Reset() { b.b.Reset() }

// Wait sleeps the next delay; false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Until runs fn until it succeeds, ctx ends (ctx's error), or fn returns an
// error Permanent marked (that error). maxTries > 0 bounds the attempts
// (the last error then). notify, when not nil, hears each failure and the
// wait before the next attempt.
func Until(ctx context.Context, p Policy, maxTries uint, fn func(ctx context.Context) error, notify func(err error, next time.Duration)) error {
	opts := []cb.RetryOption{
		cb.WithBackOff(New(p).b),
		cb.WithMaxElapsedTime(0), // bounded by ctx and maxTries, not by a clock
		cb.WithMaxTries(maxTries),
	}
	if notify != nil {
		opts = append(opts, cb.WithNotify(notify))
	}
	_, err := cb.Retry(ctx, func() (struct{}, error) { return struct{}{}, fn(ctx) }, opts...)
	return err
}

// Permanent marks err as not worth retrying: Until returns it at once.
func Permanent(err error) error { return cb.Permanent(err) }

// IsPermanent says whether err was marked Permanent, for a loop that
// retries without Until.
func IsPermanent(err error) bool {
	var p *cb.PermanentError
	return errors.As(err, &p)
}
