package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func (a *app) ipamCmd() *cobra.Command {
	return group("ipam", "Inspect and repair IPAM blocks and addresses",
		`  calico-cnm ipam show
  calico-cnm ipam check --release
  calico-cnm ipam configure --strict-affinity=true`,
		a.ipamShowCmd(), a.ipamCheckCmd(), a.ipamReleaseCmd(), a.ipamConfigureCmd())
}

func (a *app) ipamShowCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "show",
		Short:   "List the blocks with their pool, host and used/free addresses",
		Example: "  calico-cnm ipam show\n  calico-cnm ipam show -o json",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			usage, err := eng.Usage(c.Context())
			if err != nil {
				return err
			}
			sort.Slice(usage, func(i, j int) bool { return usage[i].CIDR < usage[j].CIDR })
			return printList(a.stdout, out, usage, []column[ipam.BlockUsage]{
				{header: "BLOCK", value: func(u ipam.BlockUsage) string { return u.CIDR }},
				{header: "POOL", value: func(u ipam.BlockUsage) string { return u.Pool }},
				{header: "HOST", value: func(u ipam.BlockUsage) string { return orDash(u.Host) }},
				{header: "USED", value: func(u ipam.BlockUsage) string { return strconv.Itoa(u.Used) }},
				{header: "FREE", value: func(u ipam.BlockUsage) string { return strconv.Itoa(u.Size - u.Used) }},
				{header: "SIZE", wide: true, value: func(u ipam.BlockUsage) string { return strconv.Itoa(u.Size) }},
			})
		})
	}
	return c
}

func (a *app) ipamReleaseCmd() *cobra.Command {
	var ipFlag string
	c := &cobra.Command{
		Use:     "release --ip IP",
		Short:   "Release one assigned address",
		Example: "  calico-cnm ipam release --ip 192.168.0.77",
		Args: func(c *cobra.Command, args []string) error {
			if err := noArgs(c, args); err != nil {
				return err
			}
			if net.ParseIP(ipFlag) == nil {
				return usagef("ipam release needs --ip with a valid address, got %q", ipFlag)
			}
			return nil
		},
	}
	c.Flags().StringVar(&ipFlag, "ip", "", "the address to release")
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			return a.ipamRelease(c.Context(), eng, net.ParseIP(ipFlag))
		})
	}
	return c
}

func (a *app) ipamRelease(ctx context.Context, eng *ipam.Engine, ip net.IP) error {
	// ReleaseIP is idempotent (Docker retries releases); an operator who
	// names a free address has most likely mistyped it.
	allocs, err := eng.Allocations(ctx)
	if err != nil {
		return err
	}
	handle := ""
	for _, al := range allocs {
		if al.IP.Equal(ip) {
			handle = al.HandleID
		}
	}
	if handle == "" {
		if err := inSomePool(ctx, eng, ip); err != nil {
			return err
		}
		return fmt.Errorf("%s is not allocated: nothing to release", ip)
	}
	if err := eng.ReleaseIP(ctx, ip); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "released %s (handle %s)\n", ip, handle)
	return nil
}

// inSomePool explains an address outside every pool.
func inSomePool(ctx context.Context, eng *ipam.Engine, ip net.IP) error {
	pools, err := eng.ListPools(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, p := range pools {
		if _, n, err := net.ParseCIDR(p.CIDR); err == nil && n.Contains(ip) {
			return nil
		}
		names = append(names, p.CIDR)
	}
	return fmt.Errorf("%s is not in any IP pool (pools: %s), so calico-ipam never assigned it", ip, orDash(strings.Join(names, ", ")))
}

func (a *app) ipamCheckCmd() *cobra.Command {
	var fix bool
	c := &cobra.Command{
		Use:   "check",
		Short: "Find (and with --release fix) leaked addresses, orphaned handles and affinity mistakes",
		Long: `check compares the IPAM records with the endpoints the datastore records.
It exits 3 when it found problems (and --release was not given), 0 when
there are none or they were fixed.`,
		Example: "  calico-cnm ipam check\n  calico-cnm ipam check --release",
		Args:    noArgs,
	}
	c.Flags().BoolVar(&fix, "release", false, "fix what was found (release leaked addresses, delete orphaned handles)")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, eng *ipam.Engine) error {
			return a.ipamCheck(c.Context(), store, eng, out, fix)
		})
	}
	return c
}

func (a *app) ipamCheck(ctx context.Context, store *datastore.Store, eng *ipam.Engine, out *output, fix bool) error {
	live, err := liveHandles(ctx, store, eng)
	if err != nil {
		return err
	}
	rep, err := eng.Check(ctx, func(h string) bool { return live[h] })
	if err != nil {
		return err
	}
	err = out.print(a.stdout, rep, func(w io.Writer) error {
		fmt.Fprintf(w, "leaked addresses:     %d\n", len(rep.LeakedHandles))
		for _, h := range rep.LeakedHandles {
			fmt.Fprintf(w, "  %s\n", h)
		}
		fmt.Fprintf(w, "orphaned handles:     %d\n", len(rep.OrphanedHandles))
		for _, h := range rep.OrphanedHandles {
			fmt.Fprintf(w, "  %s\n", h)
		}
		fmt.Fprintf(w, "missing affinities:   %d\n", len(rep.MissingAffinities))
		_, err := fmt.Fprintf(w, "dangling affinities:  %d\n", len(rep.DanglingAffinities))
		return err
	})
	if err != nil {
		return err
	}
	if rep.Problems() == 0 {
		return nil
	}
	if fix {
		if err := eng.Fix(ctx, rep); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "fixed %d problem(s)\n", rep.Problems())
		return nil
	}
	return problemsFound{rep.Problems()}
}

// liveHandles is the set of IPAM handles whose address belongs to an
// endpoint the datastore still records, on any node. Handles are opaque
// (Docker's RequestAddress happens before the endpoint exists), so the match
// is by address.
func liveHandles(ctx context.Context, store *datastore.Store, eng *ipam.Engine) (map[string]bool, error) {
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, err
	}
	inUse := map[string]bool{}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if err := json.Unmarshal(kv.Value, &ep); err != nil {
			continue
		}
		for _, cidr := range []string{ep.IPv4, ep.IPv6} {
			if ip, _, err := net.ParseCIDR(cidr); err == nil {
				inUse[ip.String()] = true
			}
		}
	}
	allocs, err := eng.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, al := range allocs {
		// The swarm manager's assignments (service VIPs, tasks not
		// started yet) have no endpoint record: the manager releases them.
		if inUse[al.IP.String()] || ipam.IsSwarm(al.Attrs) {
			live[al.HandleID] = true
		}
	}
	return live, nil
}
