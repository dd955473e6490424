// Package nsthread runs code inside another network namespace without
// moving the caller.
//
// Namespaces belong to threads, not to the process: a socket, a TUN or a
// /proc/sys/net file belongs to the namespace of the thread that opens it.
// So the code runs on a fresh goroutine locked to its thread: the caller's
// goroutine and thread never change namespace, and no other goroutine can
// be scheduled onto the thread while it is inside the target (the pattern
// of containernetworking/plugins/pkg/ns).
package nsthread

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// ErrNotRestored says the thread could not go back to its own namespace.
// It then stays locked, and the Go runtime terminates it when its
// goroutine ends instead of reusing it in the wrong namespace.
var ErrNotRestored = errors.New("the thread could not return to its network namespace and will be terminated")

// Do runs fn on a thread inside target and returns fn's error, joined
// with ErrNotRestored when the thread could not leave target. When target
// cannot be entered, fn does not run.
func Do(target netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening the current network namespace: %w", err)
			return
		}
		defer origin.Close()
		if err := netns.Set(target); err != nil {
			// setns failed, so the thread is still where it was.
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace %s: %w", target, err)
			return
		}
		fnErr := fn()
		if err := netns.Set(origin); err != nil {
			// Deliberately no UnlockOSThread: see ErrNotRestored.
			errc <- errors.Join(fnErr, fmt.Errorf("%w: restoring %s: %w", ErrNotRestored, origin, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}
