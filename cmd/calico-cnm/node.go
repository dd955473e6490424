package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nodes"
	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/routing"
)

func (a *app) nodeCmd() *cobra.Command {
	return group("node", "Inspect this host's daemon, list and remove nodes",
		`  calico-cnm node status
  calico-cnm node list
  calico-cnm node delete host3
  calico-cnm node rotate-key`,
		a.nodeStatusCmd(), a.nodeListCmd(), a.nodeDeleteCmd(), a.nodeRotateKeyCmd())
}

// nodeList shows every node the datastore knows, with whether its daemon
// is running (holds its liveness lease) and what it holds.
func (a *app) nodeListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "list",
		Short: "List every node: its daemon's state, BGP address, AS, blocks, addresses, endpoints, VTEP and how this host reaches it",
		Long: `list shows every node the datastore knows. -o wide adds, from each daemon's
heartbeat, its version, when it was last seen and its BGP sessions (or VXLAN
reachability), and flags what is wrong: a daemon down or unseen for longer
than --unseen-after, a version other than most nodes run, BGP sessions not
established, nodes a VXLAN node has no route to.`,
		Example: "  calico-cnm node list\n  calico-cnm node list -o wide\n  calico-cnm node list -o json --unseen-after 5m",
		Args:    noArgs,
	}
	var stateDir string
	var unseenAfter time.Duration
	c.Flags().DurationVar(&unseenAfter, "unseen-after", nodes.DefaultUnseenAfter, "flag a node whose last heartbeat is older than this")
	c.Flags().StringVar(&stateDir, "state-dir", plugin.DefaultConfig(a.getenv).StateDir, "the local daemon's state dir: its status says how it routes to each node (env "+plugin.EnvStateDir+")")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, eng *ipam.Engine) error {
			list, err := nodes.List(c.Context(), store, eng)
			if err != nil {
				return err
			}
			a.addRouteKinds(c.Context(), list, filepath.Join(stateDir, routing.StatusSocketName))
			nodes.Diagnose(list, time.Now(), unseenAfter)
			return printList(a.stdout, out, list, []column[nodes.Info]{
				{header: "NAME", value: func(n nodes.Info) string { return n.Name }},
				{header: "DAEMON", value: func(n nodes.Info) string {
					if n.Alive && n.AliveSince != nil {
						return "up since " + n.AliveSince.Format(time.RFC3339)
					}
					if n.Alive {
						return "up"
					}
					return "down"
				}},
				{header: "BGP ADDRESS", value: func(n nodes.Info) string { return orDash(n.BGPAddress) }},
				{header: "IPV6 NEXT HOP", wide: true, value: func(n nodes.Info) string { return orDash(n.IPv6NextHop) }},
				{header: "ASN", value: func(n nodes.Info) string {
					if n.ASN == 0 {
						return "-"
					}
					return strconv.FormatUint(uint64(n.ASN), 10)
				}},
				{header: "BLOCKS", value: func(n nodes.Info) string { return strconv.Itoa(n.Blocks) }},
				{header: "ADDRESSES", value: func(n nodes.Info) string { return strconv.Itoa(n.Addresses) }},
				{header: "ENDPOINTS", value: func(n nodes.Info) string { return strconv.Itoa(n.Endpoints) }},
				{header: "VTEP", value: func(n nodes.Info) string { return orDash(n.VTEP) }},
				{header: "VTEP MAC", wide: true, value: func(n nodes.Info) string { return orDash(n.VTEPMAC) }},
				{header: "ROUTES", value: func(n nodes.Info) string { return orDash(n.Routes) }},
				{header: "VERSION", wide: true, value: func(n nodes.Info) string { return orDash(n.Version) }},
				{header: "LAST SEEN", wide: true, value: func(n nodes.Info) string {
					if n.LastSeen == nil {
						return "-"
					}
					return time.Since(*n.LastSeen).Round(time.Second).String() + " ago"
				}},
				{header: "SESSIONS", wide: true, value: func(n nodes.Info) string { return sessions(n) }},
				{header: "PROBLEMS", wide: true, value: func(n nodes.Info) string {
					if len(n.Problems) == 0 {
						return "-"
					}
					return strings.Join(n.Problems, "; ")
				}},
			})
		})
	}
	return c
}

// sessions is a node's BGP sessions and VXLAN reachability as last
// published: "bgp 2/3 vxlan".
func sessions(n nodes.Info) string {
	r := n.Routing
	if r == nil {
		return "-"
	}
	var parts []string
	if r.BGP {
		parts = append(parts, fmt.Sprintf("bgp %d/%d", r.Established, r.Peers))
	}
	if r.VXLAN {
		parts = append(parts, "vxlan")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// nodeDeleteCmd removes what a decommissioned node left in the datastore.
func (a *app) nodeDeleteCmd() *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "delete NAME",
		Short: "Remove a host that is gone for good (refused while its daemon runs)",
		Long: `delete removes a node's endpoint records, its workloads' addresses, its blocks
(kept without affinity while other hosts borrow from them), its node-scoped
BGP peers and its node record, so the others stop peering with it at once.`,
		Example:           "  calico-cnm node delete host3",
		ValidArgsFunction: a.completeFrom(nodeNames),
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("node delete needs exactly one node name (see `calico-cnm node list`)")
			}
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "delete even though the node's daemon looks alive (its lease has not expired yet)")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, eng *ipam.Engine) error {
			rep, err := nodes.Delete(c.Context(), store, eng, args[0], force, a.log())
			if err != nil {
				return err
			}
			return out.print(a.stdout, rep, func(w io.Writer) error {
				fmt.Fprintf(w, "deleted node %s: %d endpoint records, %d addresses released, %d blocks released, %d blocks kept without affinity (other hosts' workloads borrow from them), %d node-scoped BGP peers\n",
					rep.Node, rep.Endpoints, len(rep.Addresses), len(rep.Blocks.Released), len(rep.Blocks.Orphaned), len(rep.BGPPeers))
				if !rep.NodeRecord {
					fmt.Fprintln(w, "(it had no node record)")
				}
				return nil
			})
		})
	}
	return c
}

func (a *app) nodeStatusCmd() *cobra.Command {
	var stateDir, socket string
	c := &cobra.Command{
		Use:   "status",
		Short: "Show this host's BGP sessions, routes and VXLAN peers (asks the local daemon)",
		Long: `status asks the daemon on this host, through <state-dir>/` + routing.StatusSocketName + `, for its BGP
sessions (address, type, state, since, prefixes received/accepted/advertised)
and routes. --timeout bounds the wait.`,
		Example: "  calico-cnm node status\n  calico-cnm node status -o json --state-dir /var/lib/calico-cnm",
		Args:    noArgs,
	}
	c.Flags().StringVar(&stateDir, "state-dir", plugin.DefaultConfig(a.getenv).StateDir, "the daemon's state dir, where its status socket is (env "+plugin.EnvStateDir+")")
	c.Flags().StringVar(&socket, "socket", "", "the daemon's BGP status socket (default: <state-dir>/"+routing.StatusSocketName+")")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		path := socket
		if path == "" {
			path = filepath.Join(stateDir, routing.StatusSocketName)
		}
		st, err := a.fetchStatus(c.Context(), path)
		if err != nil {
			return err
		}
		full := a.withWireGuardStatus(c.Context(), st, stateDir)
		return out.print(a.stdout, full, func(w io.Writer) error {
			if err := writeNodeStatus(w, st); err != nil {
				return err
			}
			return writeWireGuardStatus(w, full.WireGuard)
		})
	}
	return c
}

// fetchStatus asks the daemon's status socket, within the global timeout.
func (a *app) fetchStatus(ctx context.Context, path string) (routing.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, a.global.ds.RequestTimeout)
	defer cancel()
	return routing.FetchStatus(ctx, path)
}

func writeNodeStatus(w io.Writer, st routing.Status) error {
	if st.BGPOff {
		fmt.Fprintf(w, "calico-cnm is running on node %s, without BGP\n", st.Node)
		return writeVXLANStatus(w, st.VXLAN)
	}
	role := "node-to-node mesh"
	if !st.Mesh {
		role = "mesh off"
	}
	if st.RouteReflector {
		role += ", route reflector (cluster " + st.ClusterID + ")"
	}
	v6 := "no IPv6 routing"
	if st.IPv6NextHop != "" {
		v6 = "IPv6 next hop " + st.IPv6NextHop
	}
	fmt.Fprintf(w, "calico-cnm is running on node %s: BGP address %s, %s, AS %d, %s\n\n", st.Node, st.Address, v6, st.ASN, role)
	fmt.Fprintln(w, "BGP status (IPv4 sessions, IPv4 and IPv6 unicast)")
	var rows [][]string
	for _, p := range st.Peers {
		rows = append(rows, []string{p.Address, string(p.Type), orDash(p.Name), p.State, orDash(p.Uptime),
			strconv.Itoa(p.Received), strconv.Itoa(p.Accepted), strconv.Itoa(p.Advertised)})
	}
	if err := writeTable(w, []string{"PEER ADDRESS", "PEER TYPE", "NAME", "STATE", "SINCE", "RECEIVED", "ACCEPTED", "ADVERTISED"}, rows); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nadvertised: %s\n", orDash(strings.Join(st.Advertised, " ")))
	fmt.Fprintf(w, "learned routes: %d\n", len(st.Routes))
	if len(st.Rejected) > 0 {
		var reasons []string
		for r, n := range st.Rejected {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, r))
		}
		sort.Strings(reasons)
		fmt.Fprintf(w, "rejected paths: %s\n", strings.Join(reasons, "; "))
	}
	return writeVXLANStatus(w, st.VXLAN)
}
