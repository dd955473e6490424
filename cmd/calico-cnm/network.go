package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func (a *app) networkCmd() *cobra.Command {
	return group("network", "Inspect the calico networks Docker created",
		"  calico-cnm network list\n  calico-cnm network ports\n  calico-cnm network bandwidth net1 --ingress 30mbit", a.networkListCmd(), a.networkPortsCmd(), a.networkBandwidthCmd())
}

// networkRow is a network as listed: its record and how many endpoints it
// has on all nodes.
type networkRow struct {
	datastore.Network
	Endpoints int `json:"endpoints"`
}

func (a *app) networkListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "list",
		Short:   "List the calico networks with their subnets, pools and endpoint counts",
		Example: "  calico-cnm network list\n  calico-cnm network list -o json",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			rows, err := listNetworks(c.Context(), store)
			if err != nil {
				return err
			}
			return printList(a.stdout, out, rows, []column[networkRow]{
				{header: "NETWORK ID", value: func(r networkRow) string { return dataplane.ShortID(r.ID) },
					wideValue: func(r networkRow) string { return r.ID }},
				{header: "NAME", value: func(r networkRow) string { return orDash(r.Name) }},
				{header: "SUBNETS", value: func(r networkRow) string { return orDash(strings.Join(r.Subnets, ",")) }},
				{header: "POOLS", value: func(r networkRow) string { return orDash(strings.Join(r.Pools, ",")) }},
				{header: "ENDPOINTS", value: func(r networkRow) string { return strconv.Itoa(r.Endpoints) }},
				{header: "GATEWAYS", wide: true, value: func(r networkRow) string { return orDash(strings.Join(r.Gateways, ",")) }},
			})
		})
	}
	return c
}

// listNetworks reads the network records with their endpoint counts.
func listNetworks(ctx context.Context, store *datastore.Store) ([]networkRow, error) {
	nets, err := store.List(ctx, datastore.NetworksPrefix)
	if err != nil {
		return nil, err
	}
	eps, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, kv := range eps {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) == nil {
			count[ep.Network]++
		}
	}
	rows := []networkRow{}
	for _, kv := range nets {
		var n datastore.Network
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			continue
		}
		rows = append(rows, networkRow{n, count[n.ID]})
	}
	return rows, nil
}
