// Package await waits for a condition on state that a goroutine changes
// under its lock, announcing each change by closing a channel (and
// replacing it): the datastore syncer's revision, the policy syncer's
// programmed revision.
package await

import "context"

// Until returns nil once check reports done, or check's error, or ctx's
// error when ctx ends first. check reads the state under its owner's lock
// and returns the channel closed at the next change; it runs again after
// each change.
func Until(ctx context.Context, check func() (done bool, changed <-chan struct{}, err error)) error {
	for {
		done, changed, err := check()
		if done || err != nil {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
