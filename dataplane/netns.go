package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netns"
)

// inNetNS runs fn on an OS thread that is inside target, and returns fn's
// error.
//
// Netlink does not need this (its sockets are bound to the namespace they were
// opened in), but /proc/sys/net shows the namespace of the thread that opens
// the file, and namespaces belong to threads, not to the process. So fn runs
// on a fresh goroutine locked to its thread: the caller's goroutine and thread
// never change namespace, and no other goroutine can be scheduled onto the
// thread while it is inside target (the pattern of
// containernetworking/plugins/pkg/ns).
//
// If switching back fails, the thread stays locked: when the goroutine exits
// the Go runtime then terminates the thread instead of reusing it in the wrong
// namespace.
func inNetNS(target netns.NsHandle, log logrus.FieldLogger, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// origin is this thread's namespace: the one it must return to.
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
			// Deliberately no UnlockOSThread: see above.
			log.WithError(err).Error("Failed to restore the thread's network namespace; the thread will be terminated")
			errc <- errors.Join(fnErr, fmt.Errorf("restoring network namespace %s: %w", origin, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// sysctl is one /proc/sys setting.
type sysctl struct {
	key   string // relative to /proc/sys, e.g. "net/ipv4/ip_forward"
	value string
	// onlyIfDifferent: read first and write only on a change. Used for the
	// namespace-wide settings, which the admin has normally set already: this
	// avoids needless (and, on a read-only /proc/sys, failing) writes.
	onlyIfDifferent bool
}

// writeSysctls writes the settings in order under procSys (normally
// /proc/sys). It must run inside the target namespace (see inNetNS).
func writeSysctls(procSys string, settings []sysctl) error {
	for _, s := range settings {
		path := filepath.Join(procSys, s.key)
		if s.onlyIfDifferent {
			cur, err := os.ReadFile(path)
			if err == nil && string(bytes.TrimSpace(cur)) == s.value {
				continue
			}
		}
		if err := os.WriteFile(path, []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("setting sysctl %s=%s: %w", s.key, s.value, err)
		}
	}
	return nil
}

// readSysctl reads one setting. It must run inside the target namespace.
func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	if err != nil {
		return "", err
	}
	return string(bytes.TrimSpace(b)), nil
}
