// Package nft is the one writer of the project's nftables tables: the
// policy's ("calico-cnm": isolation, NAT, policy, host endpoints, the VXLAN
// filter) and the published ports' ("calico-cnm-ports"). Their owners
// describe the tables they want in this package's model (Ruleset, Table,
// Chain, Rule, Set); a Conn, one per network namespace, encodes them,
// diffs them against what it last programmed or read from the kernel
// (Diff, AfterOps), and applies only the differences in one netlink batch,
// serialising every table's changes. It decodes exactly what it encodes:
// a rule it cannot read back (somebody else's) is unequal to every wanted
// rule and gets replaced. Tables of other names are never touched.
package nft
