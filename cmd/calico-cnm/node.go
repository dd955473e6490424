package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nodes"
	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/routing"
)

func (c *cli) node(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("node needs a subcommand: status, list or delete")
	}
	switch args[0] {
	case "status":
		return c.nodeStatus(ctx, args[1:])
	case "list":
		return c.nodeList(ctx, args[1:])
	case "delete":
		return c.nodeDelete(ctx, args[1:])
	}
	return usagef("unknown node subcommand %q: use status, list or delete", args[0])
}

// nodeList shows every node the datastore knows, with whether its daemon
// is running (holds its liveness lease) and what it holds.
func (c *cli) nodeList(ctx context.Context, args []string) error {
	fs, cf := c.newFlagSet("node list")
	stateDir := fs.String("state-dir", plugin.DefaultConfig(c.getenv).StateDir, "the local daemon's state dir: its status says how it routes to each node (env CALICO_CNM_STATE_DIR)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("node list takes no arguments")
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	list, err := nodes.List(ctx, store, ipam.New(store, ipam.Options{Log: c.log()}))
	if err != nil {
		return err
	}
	addRouteKinds(ctx, list, filepath.Join(*stateDir, routing.StatusSocketName))
	if cf.output == "json" {
		if list == nil {
			list = []nodes.Info{}
		}
		return c.printJSON(list)
	}
	var rows [][]string
	for _, n := range list {
		state := "down"
		if n.Alive {
			state = "up since " + n.AliveSince.Format(time.RFC3339)
		}
		asn := "-"
		if n.ASN != 0 {
			asn = strconv.FormatUint(uint64(n.ASN), 10)
		}
		rows = append(rows, []string{n.Name, state, orDash(n.BGPAddress), asn,
			strconv.Itoa(n.Blocks), strconv.Itoa(n.Addresses), strconv.Itoa(n.Endpoints), orDash(n.VTEP), orDash(n.Routes)})
	}
	return c.table("NAME\tDAEMON\tBGP ADDRESS\tASN\tBLOCKS\tADDRESSES\tENDPOINTS\tVTEP\tROUTES", rows)
}

// nodeDelete removes what a decommissioned node left in the datastore.
func (c *cli) nodeDelete(ctx context.Context, args []string) error {
	fs, cf := c.newFlagSet("node delete")
	force := fs.Bool("force", false, "delete even though the node's daemon looks alive (its lease has not expired yet)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("node delete needs exactly one node name (see 'calico-cnm node list')")
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	rep, err := nodes.Delete(ctx, store, ipam.New(store, ipam.Options{Log: c.log()}), pos[0], *force, c.log())
	if err != nil {
		return err
	}
	if cf.output == "json" {
		return c.printJSON(rep)
	}
	fmt.Fprintf(c.stdout, "deleted node %s: %d endpoint records, %d addresses released, %d blocks released, %d blocks kept without affinity (other hosts' workloads borrow from them), %d node-scoped BGP peers\n",
		rep.Node, rep.Endpoints, len(rep.Addresses), len(rep.Blocks.Released), len(rep.Blocks.Orphaned), len(rep.BGPPeers))
	if !rep.NodeRecord {
		fmt.Fprintln(c.stdout, "(it had no node record)")
	}
	return nil
}

func (c *cli) nodeStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node status", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	stateDir := fs.String("state-dir", plugin.DefaultConfig(c.getenv).StateDir, "the daemon's state dir, where its status socket is (env CALICO_CNM_STATE_DIR)")
	socket := fs.String("socket", "", "the daemon's BGP status socket (default: <state-dir>/"+routing.StatusSocketName+")")
	output := fs.String("o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the daemon")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("node status takes no arguments")
	}
	if *output != "table" && *output != "json" {
		return usagef("-o %q: use table or json", *output)
	}
	path := *socket
	if path == "" {
		path = filepath.Join(*stateDir, routing.StatusSocketName)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	st, err := routing.FetchStatus(ctx, path)
	if err != nil {
		return err
	}
	if *output == "json" {
		return c.printJSON(st)
	}
	if st.BGPOff {
		fmt.Fprintf(c.stdout, "calico-cnm is running on node %s, without BGP\n", st.Node)
		return c.printVXLANStatus(st.VXLAN)
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
	fmt.Fprintf(c.stdout, "calico-cnm is running on node %s: BGP address %s, %s, AS %d, %s\n\n", st.Node, st.Address, v6, st.ASN, role)
	fmt.Fprintln(c.stdout, "BGP status (IPv4 sessions, IPv4 and IPv6 unicast)")
	var rows [][]string
	for _, p := range st.Peers {
		rows = append(rows, []string{p.Address, string(p.Type), orDash(p.Name), p.State, orDash(p.Uptime),
			strconv.Itoa(p.Received), strconv.Itoa(p.Accepted), strconv.Itoa(p.Advertised)})
	}
	if err := c.table("PEER ADDRESS\tPEER TYPE\tNAME\tSTATE\tSINCE\tRECEIVED\tACCEPTED\tADVERTISED", rows); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "\nadvertised: %s\n", orDash(strings.Join(st.Advertised, " ")))
	fmt.Fprintf(c.stdout, "learned routes: %d\n", len(st.Routes))
	if len(st.Rejected) > 0 && !st.BGPOff {
		var reasons []string
		for r, n := range st.Rejected {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, r))
		}
		sort.Strings(reasons)
		fmt.Fprintf(c.stdout, "rejected paths: %s\n", strings.Join(reasons, "; "))
	}
	return c.printVXLANStatus(st.VXLAN)
}
