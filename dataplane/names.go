package dataplane

// HostIfPrefix begins the name of every workload veth's host side
// (`cali...`): tools outside the dataplane (diagnostics) find workload
// interfaces by it.
const HostIfPrefix = hostIfPrefix
