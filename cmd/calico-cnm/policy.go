package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/ports"
)

// The resource commands, as calicoctl has them: apply, get, delete.

func (a *app) applyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "apply -f FILE|-",
		Short: "Create or replace GlobalNetworkPolicy, HostEndpoint and GlobalNetworkSet resources from YAML or JSON",
		Long: `apply reads one or more GlobalNetworkPolicy, HostEndpoint and GlobalNetworkSet
resources (YAML documents separated by ---, Lists, or JSON; kinds may be
mixed), validates all of them and writes them in one datastore transaction:
either every resource is applied or none is. Every host enforces the change
within about a second.`,
		Example: "  calico-cnm apply -f policy.yaml\n  cat policy.yaml | calico-cnm apply -f -",
		Args:    noArgs,
	}
	var file string
	c.Flags().StringVarP(&file, "filename", "f", "", "file to read, - for standard input")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if file == "" {
			return usagef("apply needs -f FILE (or -f - for standard input)")
		}
		var in io.Reader = c.InOrStdin()
		if file != "-" {
			f, err := os.Open(file)
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		rs, err := api.DecodeResources(in)
		if err != nil {
			return err
		}
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			res, err := api.ApplyResources(c.Context(), store, rs)
			if err != nil {
				return err
			}
			for _, r := range res {
				verb := "configured"
				if r.Created {
					verb = "created"
				}
				fmt.Fprintf(a.stdout, "%s %q %s\n", appliedNoun(r.Kind), r.Name, verb)
			}
			return nil
		})
	}
	return c
}

func (a *app) getCmd() *cobra.Command {
	return group("get", "Show policies, host endpoints, network sets and endpoints",
		"  calico-cnm get policy\n  calico-cnm get policy three-tier -o yaml\n  calico-cnm get hostendpoint\n  calico-cnm get globalnetworkset -o wide\n  calico-cnm get endpoints -o wide",
		a.getPolicyCmd(), getResourceCmd(a, hostEndpointKind), getResourceCmd(a, networkSetKind), a.getEndpointsCmd())
}

func (a *app) deleteCmd() *cobra.Command {
	return group("delete", "Delete a policy, host endpoint or network set",
		"  calico-cnm delete policy three-tier\n  calico-cnm delete hostendpoint host1-eth0\n  calico-cnm delete globalnetworkset blocklist",
		a.deletePolicyCmd(), deleteResourceCmd(a, hostEndpointKind), deleteResourceCmd(a, networkSetKind))
}

func (a *app) getPolicyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "policy [NAME]",
		Aliases: []string{"policies", "globalnetworkpolicy", "globalnetworkpolicies", "gnp"},
		Short:   "List policies, or show one (-o yaml prints what apply -f reads back)",
		Long: `get policy lists the policies in evaluation order. -o yaml and -o json print
the resources as apply reads them; -o wide adds each rule's packet counter on
this host (read from its nftables tables: run as root on a calico-cnm host).`,
		Example: "  calico-cnm get policy\n  calico-cnm get policy three-tier -o yaml\n  calico-cnm get policy three-tier -o wide",
		Args:    cobra.MaximumNArgs(1),
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			ps, err := a.readPolicies(c.Context(), store, args)
			if err != nil {
				return err
			}
			if out.structured() {
				var v any = api.NewList(ps)
				if len(args) == 1 {
					v = ps[0]
				}
				return a.printResource(out, v)
			}
			if err := printPolicyTable(a.stdout, ps); err != nil {
				return err
			}
			if out.wide() {
				return a.printCounters(c.Context(), ps)
			}
			return nil
		})
	}
	return c
}

// readPolicies is the one named policy, or all of them in order.
func (a *app) readPolicies(ctx context.Context, store *datastore.Store, args []string) ([]api.GlobalNetworkPolicy, error) {
	if len(args) == 1 {
		p, err := api.Get(ctx, store, args[0])
		if err != nil {
			return nil, err
		}
		return []api.GlobalNetworkPolicy{p}, nil
	}
	ps, bad, err := api.ListPolicies(ctx, store)
	for _, b := range bad {
		fmt.Fprintln(a.stderr, "warning:", b)
	}
	return ps, err
}

func printPolicyTable(w io.Writer, ps []api.GlobalNetworkPolicy) error {
	rows := make([][]string, 0, len(ps))
	for _, p := range ps {
		order := "-"
		if p.Spec.Order != nil {
			order = strconv.FormatFloat(*p.Spec.Order, 'g', -1, 64)
		}
		var types []string
		for _, t := range p.Spec.Types {
			types = append(types, string(t))
		}
		rows = append(rows, []string{p.Metadata.Name, order, orDash(p.Spec.Selector), strings.Join(types, ","),
			strconv.Itoa(len(p.Spec.Ingress)), strconv.Itoa(len(p.Spec.Egress))})
	}
	return writeTable(w, []string{"NAME", "ORDER", "SELECTOR", "TYPES", "INGRESS", "EGRESS"}, rows)
}

// printCounters reads this host's tables for the per-rule counters.
func (a *app) printCounters(ctx context.Context, ps []api.GlobalNetworkPolicy) error {
	nft, err := policy.NewNFT("", a.log())
	if err == nil {
		defer nft.Close()
		var rs policy.Ruleset
		if rs, err = nft.Dump(ctx, policy.IPv4, policy.IPv6); err == nil {
			fmt.Fprintln(a.stdout)
			rows := [][]string{}
			for _, rc := range policy.PolicyCounters(rs, ps) {
				rows = append(rows, []string{rc.Policy, fmt.Sprintf("%s[%d]", strings.ToLower(string(rc.Direction)), rc.Index), string(rc.Action),
					strconv.FormatUint(rc.Packets, 10), strconv.FormatUint(rc.Bytes, 10)})
			}
			return writeTable(a.stdout, []string{"POLICY", "RULE", "ACTION", "PACKETS", "BYTES"}, rows)
		}
	}
	return fmt.Errorf("reading this host's rule counters (needs root on a calico-cnm host): %w", err)
}

func (a *app) deletePolicyCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "policy NAME",
		Aliases: []string{"globalnetworkpolicy", "gnp"},
		Short:   "Delete a policy; its endpoints fall back to their network's rules",
		Example: "  calico-cnm delete policy three-tier",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
				if err := api.Delete(c.Context(), store, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "globalnetworkpolicy %q deleted\n", args[0])
				return nil
			})
		},
	}
}

// endpointRow is an endpoint as `get endpoints` shows it.
type endpointRow struct {
	Node          string            `json:"node"`
	ID            string            `json:"id"`
	Network       string            `json:"network"`
	IPv4          string            `json:"ipv4,omitempty"`
	IPv6          string            `json:"ipv6,omitempty"`
	Joined        bool              `json:"joined"`
	Labels        map[string]string `json:"labels,omitempty"`
	LabelsUnknown bool              `json:"labelsUnknown,omitempty"`
	Ingress       []string          `json:"ingressPolicies"`
	Egress        []string          `json:"egressPolicies"`
	// Ports are the published ports (docker run -p), which `docker port`
	// cannot show for a remote driver.
	Ports []datastore.PortBinding `json:"ports,omitempty"`
	// Bandwidth are the endpoint's limits (its own over its network's
	// defaults), as the host shapes them; Error says why they cannot be.
	Bandwidth      *bandwidth.Limits `json:"bandwidth,omitempty"`
	BandwidthError string            `json:"bandwidthError,omitempty"`
}

func (a *app) getEndpointsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "endpoints",
		Aliases: []string{"endpoint", "workloadendpoints", "wep"},
		Short:   "List endpoints on all hosts with their labels and the policies that select them",
		Example: "  calico-cnm get endpoints\n  calico-cnm get endpoints -o wide",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			rows, err := a.endpointRows(c.Context(), store)
			if err != nil {
				return err
			}
			return printList(a.stdout, out, rows, []column[endpointRow]{
				{header: "NODE", value: func(r endpointRow) string { return r.Node }},
				{header: "ENDPOINT", value: func(r endpointRow) string { return dataplane.ShortID(r.ID) }, wideValue: func(r endpointRow) string { return r.ID }},
				{header: "NETWORK", value: func(r endpointRow) string { return r.Network }},
				{header: "ADDRESSES", value: func(r endpointRow) string {
					return orDash(strings.Join(slices.DeleteFunc([]string{r.IPv4, r.IPv6}, func(s string) bool { return s == "" }), ","))
				}},
				{header: "LABELS", value: labelsText},
				{header: "INGRESS POLICIES", wide: true, value: func(r endpointRow) string { return orDash(strings.Join(r.Ingress, ",")) }},
				{header: "EGRESS POLICIES", wide: true, value: func(r endpointRow) string { return orDash(strings.Join(r.Egress, ",")) }},
				{header: "PORTS", wide: true, value: portsText},
				{header: "BANDWIDTH", wide: true, value: bandwidthText},
			})
		})
	}
	return c
}

func portsText(r endpointRow) string { return orDash(ports.Summary(r.Ports)) }

func bandwidthText(r endpointRow) string {
	switch {
	case r.BandwidthError != "":
		return "(invalid: " + r.BandwidthError + ")"
	case r.Bandwidth == nil:
		return "-"
	}
	return r.Bandwidth.String()
}

func labelsText(r endpointRow) string {
	if r.LabelsUnknown {
		return "(unknown: matches no selector)"
	}
	var kv []string
	for k, v := range r.Labels {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return orDash(strings.Join(kv, ","))
}

func (a *app) endpointRows(ctx context.Context, store *datastore.Store) ([]endpointRow, error) {
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, err
	}
	ps, bad, err := api.ListPolicies(ctx, store)
	if err != nil {
		return nil, err
	}
	for _, b := range bad {
		fmt.Fprintln(a.stderr, "warning:", b)
	}
	names := map[string]string{}
	nets, err := listNetworks(ctx, store)
	if err != nil {
		return nil, err
	}
	records := map[string]*datastore.Network{}
	for _, n := range nets {
		names[n.ID] = n.Name
		records[n.ID] = &n.Network
	}
	var rows []endpointRow
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if err := json.Unmarshal(kv.Value, &ep); err != nil {
			fmt.Fprintf(a.stderr, "warning: unreadable endpoint record %s: %v\n", kv.Key, err)
			continue
		}
		node, _, _ := datastore.EndpointNodeAndID(kv.Key)
		r := endpointRow{Node: node, ID: ep.ID, Network: orDash(names[ep.Network]), IPv4: ep.IPv4, IPv6: ep.IPv6, Joined: ep.Joined,
			Labels: ep.Labels, LabelsUnknown: ep.LabelsUnknown, Ingress: []string{}, Egress: []string{}, Ports: ep.Ports}
		if r.Network == "-" {
			r.Network = dataplane.ShortID(ep.Network)
		}
		if l, err := bandwidth.EndpointLimits(ep, records[ep.Network]); err != nil {
			r.BandwidthError = err.Error()
		} else if !l.None() {
			r.Bandwidth = &l
		}
		if ep.Joined && !ep.LabelsUnknown {
			r.Ingress = append(r.Ingress, policy.SelectingPolicies(ps, ep.Labels, api.Ingress)...)
			r.Egress = append(r.Egress, policy.SelectingPolicies(ps, ep.Labels, api.Egress)...)
		}
		rows = append(rows, r)
	}
	return rows, nil
}
