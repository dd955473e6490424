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

	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/routing"
)

func (c *cli) node(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "status" {
		return usagef("node needs the subcommand status")
	}
	fs := flag.NewFlagSet("node status", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	stateDir := fs.String("state-dir", plugin.DefaultConfig(c.getenv).StateDir, "the daemon's state dir, where its status socket is (env CALICO_CNM_STATE_DIR)")
	socket := fs.String("socket", "", "the daemon's BGP status socket (default: <state-dir>/"+routing.StatusSocketName+")")
	output := fs.String("o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the daemon")
	pos, err := parse(fs, args[1:])
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
	role := "node-to-node mesh"
	if !st.Mesh {
		role = "mesh off"
	}
	if st.RouteReflector {
		role += ", route reflector (cluster " + st.ClusterID + ")"
	}
	fmt.Fprintf(c.stdout, "calico-cnm is running on node %s: BGP address %s, AS %d, %s\n\n", st.Node, st.Address, st.ASN, role)
	fmt.Fprintln(c.stdout, "IPv4 BGP status")
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
	if len(st.Rejected) > 0 {
		var reasons []string
		for r, n := range st.Rejected {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, r))
		}
		sort.Strings(reasons)
		fmt.Fprintf(c.stdout, "rejected paths: %s\n", strings.Join(reasons, "; "))
	}
	return nil
}
