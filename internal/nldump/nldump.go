// Package nldump runs netlink dumps again when the kernel reports that a
// dump raced with a change (netlink.ErrDumpInterrupted: the answer may be
// incomplete). Every owner of kernel state lists through it, so a busy
// host (containers starting by the hundred) never reads a partial list as
// the truth.
package nldump

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// Tries bounds the dumps of one Retry.
const Tries = 5

// Retry runs dump until it is not interrupted, at most Tries times; the
// last answer and error are returned.
func Retry[T any](dump func() ([]T, error)) ([]T, error) {
	var (
		out []T
		err error
	)
	for range Tries {
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return out, err
}
