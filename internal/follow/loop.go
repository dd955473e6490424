package follow

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/lastpass"
)

// Loop is the run loop of a manager that makes the kernel match the
// datastore in whole passes (the VXLAN and WireGuard managers): a pass at
// the start, then one after every burst of changes under Prefixes and
// every Resync, until ctx ends or the datastore can no longer be followed.
type Loop struct {
	// Name names the subscription to Records (Prefixes).
	Name     string
	Records  datastore.Records
	Prefixes []string
	// Resync is the interval of a pass without changes.
	Resync time.Duration
	// Pass is one pass; its error is recorded in Last and logged with
	// FailMsg, and the next change or resync retries.
	Pass func(ctx context.Context) error
	Last *lastpass.Outcome
	// Log is the manager's logger as it is now: a pass may add fields
	// to it (the VXLAN manager's address and uplink, once located).
	Log     func() logrus.FieldLogger
	FailMsg string
	// Matters, if set, says whether a change under prefix is worth a pass
	// now (a change it declines starts none, but the next pass reads it).
	Matters func(prefix string) bool
	// Calls, if set, are run on the loop's goroutine between passes, so
	// they own what the passes own; a pass follows each.
	Calls <-chan func(ctx context.Context)
	// PassMsg, if set, is logged at debug level with the cause of every
	// pass after the first (a prefix, "resync" or "call").
	PassMsg string
}

// Run works until ctx ends, and returns nil then. It gives up, with the
// error, when it can no longer follow the datastore (the syncer stopped):
// going on would leave the kernel unmanaged while the daemon looks fine.
func (l Loop) Run(ctx context.Context) error {
	// The subscription starts with what the syncer holds and then has
	// every change; the passes read the syncer's memory.
	dirty := make(chan string, 8)
	gaveUp := Prefixes(ctx, l.Records, l.Name, l.Prefixes, dirty)
	ticker := time.NewTicker(l.Resync)
	defer ticker.Stop()
	for {
		err := l.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		l.Last.Record(err)
		if err != nil {
			l.Log().WithError(err).Warn(l.FailMsg)
		}
		cause, err := l.Wait(ctx, dirty, gaveUp, ticker.C)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if l.PassMsg != "" {
			l.Log().WithField("cause", cause).Debug(l.PassMsg)
		}
	}
}

// Wait waits for a change that matters, a resync or a call, returning
// what it was (an error when ctx ended or the follower of the datastore
// gave up), and drains the changes queued meanwhile: the pass that
// follows reads them all, so a burst costs one pass.
func (l Loop) Wait(ctx context.Context, dirty <-chan string, gaveUp <-chan error, resync <-chan time.Time) (string, error) {
	cause := ""
	for cause == "" {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case err := <-gaveUp:
			return "", err
		case prefix := <-dirty:
			if l.Matters == nil || l.Matters(prefix) {
				cause = prefix
			}
		case <-resync:
			cause = "resync"
		case call := <-l.Calls:
			call(ctx)
			cause = "call"
		}
	}
	for {
		select {
		case <-dirty:
		default:
			return cause, nil
		}
	}
}
