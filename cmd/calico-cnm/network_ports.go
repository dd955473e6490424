package main

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/ports"
)

// portRow is one published port. `docker port` cannot show what a remote
// network driver publishes (dockerd reads the mappings back only from its
// own bridge driver, moby/libnetwork#2451), so this is where to look.
type portRow struct {
	Node     string `json:"node"`
	Endpoint string `json:"endpoint"`
	Network  string `json:"network"`
	IP       string `json:"ip"`
	datastore.PortBinding
}

func (a *app) networkPortsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "ports",
		Short:   "List the published ports (docker run -p/-P) of the calico endpoints, which `docker port` cannot show",
		Example: "  calico-cnm network ports\n  calico-cnm network ports -o json",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			rows, err := listPorts(c.Context(), store)
			if err != nil {
				return err
			}
			return printList(a.stdout, out, rows, []column[portRow]{
				{header: "NODE", value: func(r portRow) string { return r.Node }},
				{header: "ENDPOINT", value: func(r portRow) string { return dataplane.ShortID(r.Endpoint) },
					wideValue: func(r portRow) string { return r.Endpoint }},
				{header: "IP", value: func(r portRow) string { return orDash(r.IP) }},
				{header: "PORT", value: func(r portRow) string { return ports.String(r.PortBinding) }},
				{header: "NETWORK", wide: true, value: func(r portRow) string { return r.Network }},
			})
		})
	}
	return c
}

// listPorts reads the bindings of the joined endpoints of every node.
func listPorts(ctx context.Context, store *datastore.Store) ([]portRow, error) {
	eps, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, err
	}
	rows := []portRow{}
	for _, kv := range eps {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) != nil || !ep.Joined {
			continue
		}
		ip, _, _ := strings.Cut(ep.IPv4, "/")
		for _, b := range ep.Ports {
			rows = append(rows, portRow{Node: ep.Node, Endpoint: ep.ID, Network: ep.Network, IP: ip, PortBinding: b})
		}
	}
	return rows, nil
}
