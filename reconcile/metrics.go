package reconcile

// Reconcile fix kinds (the "kind" label of the daemon's reconcile fixes metric).
const (
	FixEndpointRemoved  = "endpoint_removed"
	FixAddressReleased  = "address_released"
	FixOrphanReleased   = "orphan_released"
	FixRouteRestored    = "route_restored"
	FixInterfaceRemoved = "interface_removed"
	FixAddressReclaimed = "address_reclaimed"
	FixEndpointRebuilt  = "endpoint_rebuilt"
	// FixShapingRepaired counts endpoints whose bandwidth shaping was
	// rebuilt or updated and leftover shaping removed.
	FixShapingRepaired = "shaping_repaired"
)

// Reconcile pass results (the "result" label of the daemon's reconcile runs metric).
const (
	ResultOK       = "ok"
	ResultNoDocker = "docker_unavailable"
	ResultFailed   = "error"
)

// FixKinds are every Fix* kind, for a metric to show each at 0 from the
// start.
func FixKinds() []string {
	return []string{FixEndpointRemoved, FixAddressReleased, FixOrphanReleased, FixRouteRestored, FixInterfaceRemoved, FixAddressReclaimed, FixEndpointRebuilt, FixShapingRepaired}
}

// Results are every pass result.
func Results() []string { return []string{ResultOK, ResultNoDocker, ResultFailed} }

// Metrics counts passes and repairs (*plugin.Metrics).
type Metrics interface {
	// Fixed counts n repairs of kind (a Fix* constant).
	Fixed(kind string, n int)
	// ReconcileRun counts a pass by result (a Result* constant).
	ReconcileRun(result string)
	// PassScheduled says whether a pass is due soon, beside the periodic
	// one: a Docker event's (waiting out its debounce) or a follow-up for
	// maturing candidates. A host is quiet once none is.
	PassScheduled(scheduled bool)
}
