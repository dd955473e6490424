// Plain TCP, not Multipath TCP, for every listener of the daemon. Since Go
// 1.24 net.ListenConfig opens MPTCP sockets by default, and the kernel
// refuses TCP-only socket options on them: gobgp's BGP listener could not
// get the TCP MD5 keys of its peers (ENOPROTOOPT, "failed to set md5 ...
// protocol not available": a router that dials us with MD5 was silently
// refused, only our own outgoing connections carried the key) nor the TTL
// of 255 that TTL-security peers need (EOPNOTSUPP, "cannot set TTL (255)
// for TCPListener" at every start).

//go:debug multipathtcp=0

package main
