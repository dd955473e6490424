package main

import (
	"runtime/debug"
	"strings"

	"github.com/sirupsen/logrus"
)

// defaultMemoryLimit is the soft memory limit serve gives the Go runtime.
// Near the limit the collector runs sooner and the scavenger returns free
// pages at once. The limit is soft: a daemon that needs more still gets it
// (the runtime then bounds the collector's CPU share rather than fail).
const defaultMemoryLimit = 40 << 20

// defaultGCPercent is the collector's target serve sets: the heap may grow
// by 40% of what is live before the next collection, not by the runtime's
// 100%. The daemon's live heap grows with the host's endpoints (about 12
// MiB with a thousand), and with the runtime's target the heap grew to
// twice that between collections: 9 MiB more resident with a thousand
// endpoints. A collection of a heap this small costs well under a
// millisecond of a core, so collecting more often costs the daemon little
// CPU; the soft limit alone starts collecting early only near 40 MiB,
// which a host with few containers never reaches.
const defaultGCPercent = 40

// runtimeMemory is what serve sets in the Go runtime: the soft memory
// limit and the collector's target, each unless the operator chose it in
// the environment (the runtime has applied GOMEMLIMIT and GOGC already).
// GOGC=off turns the collector off: a limit would turn it back on near the
// limit, so neither is set then.
type runtimeMemory struct {
	limit     int64
	setLimit  bool
	gcPercent int
	setGC     bool
}

func chooseRuntimeMemory(getenv func(string) string) runtimeMemory {
	// Exactly "off", as the runtime reads it: any other word is its 100%.
	gogc := getenv("GOGC")
	if gogc == "off" {
		return runtimeMemory{}
	}
	var m runtimeMemory
	if strings.TrimSpace(getenv("GOMEMLIMIT")) == "" {
		m.limit, m.setLimit = defaultMemoryLimit, true
	}
	if strings.TrimSpace(gogc) == "" {
		m.gcPercent, m.setGC = defaultGCPercent, true
	}
	return m
}

// applyRuntimeMemory sets what chooseRuntimeMemory chooses.
func applyRuntimeMemory(getenv func(string) string, log logrus.FieldLogger) {
	m := chooseRuntimeMemory(getenv)
	if m.setLimit {
		debug.SetMemoryLimit(m.limit)
	}
	if m.setGC {
		debug.SetGCPercent(m.gcPercent)
	}
	log.WithFields(logrus.Fields{"memoryLimit": m.limit, "gcPercent": m.gcPercent}).Debug("Go runtime memory settings (0: left to GOMEMLIMIT or GOGC)")
}
