package main

import (
	"runtime/debug"
	"strings"

	"github.com/sirupsen/logrus"
)

// defaultMemoryLimit is the soft memory limit serve gives the Go runtime.
// With GOGC alone the heap grows to twice what is live before the
// collector runs, and freed pages go back to the kernel only slowly: with
// a thousand endpoints the daemon's heap goal was some 25 MiB for about 12
// MiB live. Near the limit the collector runs sooner and the scavenger
// returns free pages at once. The limit is soft: a daemon that needs more
// still gets it (the runtime then bounds the collector's CPU share rather
// than fail).
const defaultMemoryLimit = 40 << 20

// memoryLimit is the soft memory limit serve sets, and whether it sets
// one: not when the operator chose one (GOMEMLIMIT, which the runtime has
// applied already) or turned the collector off (GOGC=off: a limit would
// turn it back on near the limit).
func memoryLimit(getenv func(string) string) (int64, bool) {
	if strings.TrimSpace(getenv("GOMEMLIMIT")) != "" {
		return 0, false
	}
	if strings.EqualFold(strings.TrimSpace(getenv("GOGC")), "off") {
		return 0, false
	}
	return defaultMemoryLimit, true
}

// applyMemoryLimit sets the soft memory limit memoryLimit chooses, if any.
func applyMemoryLimit(getenv func(string) string, log logrus.FieldLogger) {
	limit, ok := memoryLimit(getenv)
	if !ok {
		log.Debug("soft memory limit left to the environment (GOMEMLIMIT or GOGC=off set)")
		return
	}
	debug.SetMemoryLimit(limit)
	log.WithField("bytes", limit).Debug("soft memory limit set")
}
