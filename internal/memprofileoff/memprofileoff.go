// Package memprofileoff turns the Go runtime's heap profiling off when it
// is initialised, which is before the packages that allocate most at start
// (it imports nothing but the runtime, so it is initialised among the
// first). The binary serves no heap profiles, yet the runtime samples
// allocations whenever a linked package can read them (etcd's embedded
// server links the profiler's handlers): it then keeps a table of the
// sampled call stacks, about 1.5 MiB of the daemon's memory.
package memprofileoff

import "runtime"

func init() { runtime.MemProfileRate = 0 }
