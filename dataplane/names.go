package dataplane

// HostIfPrefix begins the name of every workload veth's host side
// (`cali...`). Calico uses the same prefix; the policy and the published
// ports match workload interfaces by it (iptables' `cali+`), and tools
// outside the dataplane (diagnostics) find workload interfaces by it.
const HostIfPrefix = "cali"

// shortIDLen is how much of a 64-hex-digit Docker id is shown, as Docker
// itself shows it.
const shortIDLen = 12

// ShortID is id as Docker shows it (its first 12 characters): for logs,
// errors and rule comments.
func ShortID(id string) string {
	if len(id) > shortIDLen {
		return id[:shortIDLen]
	}
	return id
}
