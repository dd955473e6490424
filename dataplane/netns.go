package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netns"

	"github.com/calico-cnm/calico-cnm/internal/nsthread"
)

// inNetNS runs fn on an OS thread that is inside target, and returns fn's
// error.
//
// Netlink does not need this (its sockets are bound to the namespace they were
// opened in), but /proc/sys/net shows the namespace of the thread that opens
// the file (see nsthread).
func inNetNS(target netns.NsHandle, log logrus.FieldLogger, fn func() error) error {
	err := nsthread.Do(target, fn)
	if errors.Is(err, nsthread.ErrNotRestored) {
		log.WithError(err).Error("Failed to restore the thread's network namespace; the thread will be terminated")
	}
	return err
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
