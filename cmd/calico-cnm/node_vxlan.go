package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/calico-cnm/calico-cnm/nodes"
	"github.com/calico-cnm/calico-cnm/routing"
)

// writeVXLANStatus is the VXLAN part of `node status`: this node's tunnel
// endpoint and, per other node, its VTEP and how its workloads are reached.
func writeVXLANStatus(w io.Writer, st *routing.VXLANStatus) error {
	if st == nil {
		return nil
	}
	fmt.Fprintln(w)
	if st.Device == "" {
		_, err := fmt.Fprintln(w, "VXLAN: off (no pool has a vxlanMode)")
		return err
	}
	fmt.Fprintf(w, "VXLAN: device %s, VTEP %s, MAC %s, MTU %d\n", st.Device, st.VTEP, st.MAC, st.MTU)
	var rows [][]string
	for _, n := range st.Nodes {
		rows = append(rows, []string{n.Name, orDash(n.NodeIP), orDash(n.VTEP), orDash(n.MAC), string(n.Routes), orDash(strings.Join(n.Blocks, " "))})
	}
	return writeTable(w, []string{"NODE", "NODE ADDRESS", "VTEP", "VTEP MAC", "ROUTES", "BLOCKS"}, rows)
}

// addRouteKinds fills in how the local daemon reaches each node, when a
// daemon answers on socket; otherwise the column stays empty. Nodes the
// VXLAN manager does not report are routed by BGP if the daemon runs it.
func (a *app) addRouteKinds(ctx context.Context, list []nodes.Info, socket string) {
	st, err := a.fetchStatus(ctx, socket)
	if err != nil {
		return
	}
	kinds := map[string]routing.RouteKind{}
	if st.VXLAN != nil {
		for _, n := range st.VXLAN.Nodes {
			kinds[n.Name] = n.Routes
		}
	}
	for i := range list {
		if list[i].Name == st.Node {
			list[i].Routes = "self"
			continue
		}
		k, ok := kinds[list[i].Name]
		if (!ok || k == routing.RouteNone) && !st.BGPOff {
			k = routing.RouteBGP
		}
		if ok || !st.BGPOff {
			list[i].Routes = string(k)
		}
	}
}
