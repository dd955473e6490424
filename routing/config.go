// Package routing makes the host a router: an in-process BGP speaker that
// advertises this host's blocks and installs its peers' blocks into the
// kernel.
package routing

// Config is the daemon's BGP configuration (flags and env of `serve`).
type Config struct {
	// Enabled turns the BGP speaker on. Off, the host still routes its own
	// containers but shares no routes with other hosts.
	Enabled bool
}
