package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// resourceKind is what get and delete need of a resource kind besides
// policies: host endpoints and network sets.
type resourceKind[T any] struct {
	use     string
	aliases []string
	noun    string // as apply prints it
	short   string
	example string
	list    func(ctx context.Context, s *datastore.Store) ([]T, []error, error)
	get     func(ctx context.Context, s *datastore.Store, name string) (T, error)
	del     func(ctx context.Context, s *datastore.Store, name string) error
	wrap    func([]T) any // the List printed for several
	cols    []column[T]
}

var hostEndpointKind = resourceKind[api.HostEndpoint]{
	use: "hostendpoint", aliases: []string{"hostendpoints", "hep", "heps"}, noun: "hostendpoint",
	short:   "List host endpoints (the hosts' interfaces under policy), or show one",
	example: "  calico-cnm get hostendpoint\n  calico-cnm get hostendpoint host1-eth0 -o yaml",
	list:    api.ListHostEndpoints, get: api.GetHostEndpoint, del: api.DeleteHostEndpoint,
	wrap: func(hs []api.HostEndpoint) any { return api.NewHostEndpointList(hs) },
	cols: []column[api.HostEndpoint]{
		{header: "NAME", value: func(h api.HostEndpoint) string { return h.Metadata.Name }},
		{header: "NODE", value: func(h api.HostEndpoint) string { return h.Spec.Node }},
		{header: "INTERFACE", value: func(h api.HostEndpoint) string { return orDash(h.Spec.InterfaceName) }},
		{header: "EXPECTED IPS", value: func(h api.HostEndpoint) string { return orDash(strings.Join(h.Spec.ExpectedIPs, ",")) }},
		{header: "LABELS", value: func(h api.HostEndpoint) string { return labelList(h.Metadata.Labels) }},
	},
}

var networkSetKind = resourceKind[api.GlobalNetworkSet]{
	use: "globalnetworkset", aliases: []string{"globalnetworksets", "networkset", "networksets", "gns"}, noun: "globalnetworkset",
	short:   "List network sets (named lists of networks that rule selectors match), or show one",
	example: "  calico-cnm get globalnetworkset\n  calico-cnm get globalnetworkset blocklist -o yaml",
	list:    api.ListNetworkSets, get: api.GetNetworkSet, del: api.DeleteNetworkSet,
	wrap: func(ns []api.GlobalNetworkSet) any { return api.NewNetworkSetList(ns) },
	cols: []column[api.GlobalNetworkSet]{
		{header: "NAME", value: func(n api.GlobalNetworkSet) string { return n.Metadata.Name }},
		{header: "NETS", value: func(n api.GlobalNetworkSet) string { return strconv.Itoa(len(n.Spec.Nets)) },
			wideValue: func(n api.GlobalNetworkSet) string { return orDash(strings.Join(n.Spec.Nets, ",")) }},
		{header: "LABELS", value: func(n api.GlobalNetworkSet) string { return labelList(n.Metadata.Labels) }},
	},
}

func labelList(l map[string]string) string {
	kv := make([]string, 0, len(l))
	for k, v := range l {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return orDash(strings.Join(kv, ","))
}

// getResourceCmd is `get KIND [NAME]`.
func getResourceCmd[T any](a *app, k resourceKind[T]) *cobra.Command {
	c := &cobra.Command{
		Use:     k.use + " [NAME]",
		Aliases: k.aliases,
		Short:   k.short,
		Long:    k.short + ". -o yaml and -o json print the resources as apply -f reads them back.",
		Example: k.example,
		Args:    cobra.MaximumNArgs(1),
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			var items []T
			if len(args) == 1 {
				it, err := k.get(c.Context(), store, args[0])
				if err != nil {
					return err
				}
				items = []T{it}
			} else {
				var bad []error
				var err error
				if items, bad, err = k.list(c.Context(), store); err != nil {
					return err
				}
				for _, b := range bad {
					fmt.Fprintln(a.stderr, "warning:", b)
				}
			}
			if out.structured() {
				var v any = k.wrap(items)
				if len(args) == 1 {
					v = items[0]
				}
				return a.printResource(out, v)
			}
			return printList(a.stdout, out, items, k.cols)
		})
	}
	return c
}

// deleteResourceCmd is `delete KIND NAME`.
func deleteResourceCmd[T any](a *app, k resourceKind[T]) *cobra.Command {
	return &cobra.Command{
		Use:     k.use + " NAME",
		Aliases: k.aliases,
		Short:   "Delete a " + k.noun,
		Example: "  calico-cnm delete " + k.use + " NAME",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
				if err := k.del(c.Context(), store, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s %q deleted\n", k.noun, args[0])
				return nil
			})
		},
	}
}

// printResource prints a resource or a List as apply -f reads it back
// (-o yaml or -o json).
func (a *app) printResource(out *output, v any) error {
	enc := api.YAML
	if out.format == formatJSON {
		enc = api.JSON
	}
	b, err := enc(v)
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(b)
	return err
}

// appliedNoun is how apply names a resource of kind in its output.
func appliedNoun(kind string) string { return strings.ToLower(kind) }
