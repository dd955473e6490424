// Package policy gives calico networks outgoing NAT and network isolation
// with nftables, in tables of the project's own: "ip calico-cnm" and
// "ip6 calico-cnm". It never lists, changes or deletes any other table
// (Docker's, iptables-nft's, the user's); rules are written over netlink
// (github.com/google/nftables), so the plugin needs no nft binary.
//
// # What the tables do
//
// Outgoing NAT: a packet from an address of a pool with natOutgoing to a
// destination outside every pool is masqueraded to the host's address
// (postrouting, srcnat priority). Traffic between pool addresses is never
// NATed, so containers see each other's real addresses, on any host.
//
// Isolation, in a forward filter chain (filter priority, policy accept):
//
//   - established/related traffic (replies) passes;
//   - a cali* interface that this host has no joined endpoint record for
//     gets no traffic at all (fail closed, as Felix does);
//   - per joined local endpoint one or two rules keyed on its cali
//     interface: `oifname caliX jump in-<net>` (traffic to it) and, for
//     isolated networks, `iifname caliX jump out-<net>` (traffic from it);
//   - per local Docker network a pair of chains: in-<net> returns for
//     members of the network's address set (net-<key>, its endpoints on
//     every host), drops other pool addresses (other calico networks),
//     and for sources outside the pools applies the network's ingress
//     option; out-<net> returns for the network's own members and
//     destinations outside the pools and drops other pool addresses.
//
// Chains only drop or return, so a packet between two local containers
// passes both the receiver's ingress and the sender's egress checks. The
// host's own traffic to and from its containers is never filtered (health
// checks, published ports reached from the host, the container's gateway
// 169.254.1.1): it does not cross the forward hook, and the host endpoint
// chains (desired_host.go) let it pass, as Felix does. Host endpoints put
// the host's own interfaces under policy: pre-DNAT, normal and
// applyOnForward policies, with failsafe ports (see desired_host.go).
//
// Docker sets the iptables FORWARD policy to DROP, and the dataplane puts
// `iifname/oifname cali* accept` into Docker's DOCKER-USER chain for that.
// An accept in one base chain does not end the packet's way through other
// base chains of the same hook, while a drop anywhere is final: so our drops
// hold whatever Docker's chain accepts, and our accepts (replies) open
// nothing that Docker's chain drops.
//
// # Network policy (GlobalNetworkPolicy)
//
// Policies (package policy/api, stored under api.PoliciesPrefix) select
// endpoints by their labels (package policy/selector; the labels are on
// the endpoint record, see labels.go). For a local endpoint that a policy
// selects for a direction, the forward chain's jump for that direction
// goes to a dispatch chain (to-<h> for ingress, from-<h> for egress)
// instead of the network's chain. A dispatch chain is shared by every
// endpoint with the same ordered list of selecting policies and the same
// network chain (its profile); it clears two packet mark bits, jumps to
// each policy's chain (pi-<h>/po-<h>, one per policy and direction, shared
// by all endpoints) while neither bit is set, then returns when a rule
// allowed the packet (markAccept), goes to the network's chain on Pass
// (markPass), and drops otherwise (default deny). Log rules log with the
// prefix LogPrefix+name and go on.
// A Deny rule marks the packet (markDeny) and the dispatch chain drops it
// in a rule of the endpoint's own, whose counter is the endpoint's denied
// packets. Rule selectors and nets are named interval sets (sel-, nsel-,
// nets-) holding the addresses of the cluster's joined endpoints that
// match, the expectedIPs of matching host endpoints and the networks of
// matching GlobalNetworkSets; they change by whole ranges: rules grow with
// the local endpoints and the policies, never with the cluster; a label
// change anywhere changes set elements only. An endpoint whose labels are
// unknown matches no selector (it is in every notSelector's exclusion
// set) and, while policies exist for a direction, is sent to a chain that
// drops everything (fail closed).
//
// # Join waits for the kernel
//
// The driver writes the joined endpoint record (with its labels) and then
// waits (WaitProgrammed, bounded) until the syncer has applied a state that
// includes every endpoint record change up to that write: the container's
// first packet meets its rules. While the tables cannot be programmed,
// Health reports why (the daemon's /healthz) and Joins fail rather than
// start containers black-holed by the fail-closed rules below.
//
// # Network options (docker network create -o KEY=VALUE)
//
//   - calico.isolation=on|off (default on). Off: the network's containers
//     talk to containers of any other network whose isolation is off too.
//     Isolation is symmetric: traffic between two networks needs both off.
//   - calico.ingress=cluster|host|any (default cluster): who outside the
//     pools may open connections to the network's containers: the cluster's
//     hosts (the IPv4 address of each node record, i.e. what BGP uses), only
//     the container's own host, or anybody.
//   - calico.network=NAME: the logical network, see below.
//
// # Network identity across hosts
//
// Docker networks of a local-scope driver are per dockerd: `docker network
// create net1` on two hosts makes two networks with different ids, and
// Docker does not pass the name to the driver. The policy's identity of a
// network (NetworkKey) is therefore, in this order:
//
//  1. the calico.network option, if given (lets a network join another
//     one whatever it is called);
//  2. the Docker network's name, recorded in the network record's Name
//     field: the daemon asks its own Docker for the name of every unnamed
//     network record (docker network inspect <id>) in the background,
//     never from inside a plugin request (dockerd may be waiting for that
//     request), retrying with a growing delay while Docker does not know
//     the id yet (its creation is still in flight) or at all (another
//     host's network, which that host names);
//  3. the Docker network id, until the name is known: the network is then
//     isolated even from its namesakes on other hosts (fail closed).
//
// So networks of the same name form one network on all hosts that share a
// datastore, like a swarm-scope network (whose id is the same everywhere
// anyway). Endpoints of a network whose record is missing are grouped by
// the network id.
//
// # Lifecycle
//
// The Syncer follows the datastore (pools/, networks/, endpoints/, nodes/)
// with etcd watches, re-listing when a watch breaks, and after every burst
// of changes computes the desired tables (Desired, a pure function of the
// records) and hands them to NFT.Apply (package nft, the one writer of the
// project's nftables tables), which reads our tables back, diffs (Diff) and
// applies the differences in one netlink batch, atomically: a
// join adds the endpoint's rules and set elements, a leave deletes exactly
// those, a pool change rewrites the pool sets. Anything the kernel refuses
// falls back to rewriting the tables whole, again in one batch. At start
// and every resync interval the kernel is compared with the datastore and
// repaired. The tables are kept when the daemon stops: they go on
// protecting the running containers through a restart or upgrade.
package policy
