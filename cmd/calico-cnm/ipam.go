package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

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
	// Only the assignment listed above: not whoever got the address since.
	eng.ExpectRelease(ip, handle)
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
	var minAge time.Duration
	c := &cobra.Command{
		Use:   "check",
		Short: "Find (and with --release fix) leaked addresses, orphaned handles and affinity mistakes",
		Long: `check compares the IPAM records with the endpoints the datastore records
and with the containers this node's Docker (DOCKER_HOST) has, on every
network. An address is leaked only when it is certainly dead: in no endpoint
record, unknown to Docker on the node that assigned it (NODENAME; other
nodes' addresses are only reported, as unverified), neither the swarm
manager's nor an --aux-address/gateway reservation, and assigned longer
than --min-age ago. --release re-checks each leak just before releasing it,
by its handle.
It exits 3 when it found problems (and --release was not given), 0 when
there are none or they were fixed.`,
		Example: "  calico-cnm ipam check\n  NODENAME=host1 calico-cnm ipam check --release --min-age 1h",
		Args:    noArgs,
	}
	c.Flags().BoolVar(&fix, "release", false, "fix what was found (release leaked addresses, delete orphaned handles)")
	c.Flags().DurationVar(&minAge, "min-age", defaultLeakMinAge, "an address assigned more recently is never a leak")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, eng *ipam.Engine) error {
			return a.ipamCheck(c.Context(), store, eng, out, fix, minAge)
		})
	}
	return c
}

func (a *app) ipamCheck(ctx context.Context, store *datastore.Store, eng *ipam.Engine, out *output, fix bool, minAge time.Duration) error {
	rules, err := a.leakRules(ctx, store, minAge)
	if err != nil {
		return err
	}
	rep, err := eng.Check(ctx, rules)
	if err != nil {
		return err
	}
	err = out.print(a.stdout, rep, func(w io.Writer) error {
		fmt.Fprintf(w, "leaked addresses:     %d\n", len(rep.LeakedHandles))
		for _, h := range rep.LeakedHandles {
			fmt.Fprintf(w, "  %s\n", h)
		}
		if len(rep.Unverified) > 0 {
			fmt.Fprintf(w, "unverified addresses: %d (never released; run the check on their node)\n", len(rep.Unverified))
			for _, s := range rep.Unverified {
				fmt.Fprintf(w, "  %s %s node %s: %s\n", s.Handle, s.IP, orDash(s.Node), s.Why)
			}
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
		if rep, err = a.recheckLeaks(ctx, store, eng, rep, minAge); err != nil {
			return err
		}
		if err := eng.Fix(ctx, rep); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "fixed %d problem(s)\n", rep.Problems())
		return nil
	}
	return problemsFound{rep.Problems()}
}
