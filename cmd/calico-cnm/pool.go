package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func (a *app) poolCmd() *cobra.Command {
	return group("pool", "Manage the IP pools calico-ipam assigns from",
		`  calico-cnm pool add 10.10.0.0/16 --nat-outgoing
  calico-cnm pool list -o wide`,
		a.poolAddCmd(), a.poolListCmd(), a.poolDeleteCmd(),
		a.poolSetDisabledCmd("disable", true), a.poolSetDisabledCmd("enable", false))
}

// oneCIDR is the argument check of the pool commands that name one pool.
func oneCIDR(c *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s needs exactly one CIDR, e.g. `calico-cnm %s 10.10.0.0/16`", cmdName(c), cmdName(c))
	}
	if _, _, err := net.ParseCIDR(args[0]); err != nil {
		return usagef("%q is not a CIDR (expected e.g. 10.10.0.0/16)", args[0])
	}
	return nil
}

func (a *app) poolAddCmd() *cobra.Command {
	var p ipam.Pool
	c := &cobra.Command{
		Use:   "add CIDR",
		Short: "Add an IP pool (no overlaps; /26 blocks for IPv4, /122 for IPv6 by default)",
		Example: `  calico-cnm pool add 10.10.0.0/16
  calico-cnm pool add 10.20.0.0/24 --block-size 28 --nat-outgoing
  calico-cnm pool add fd00:cafe::/64 -o json`,
		Args: oneCIDR,
	}
	c.Flags().IntVar(&p.BlockSize, "block-size", 0, "block prefix length (default 26 for IPv4, 122 for IPv6)")
	c.Flags().BoolVar(&p.NATOutgoing, "nat-outgoing", false, "masquerade traffic leaving the pools")
	c.Flags().BoolVar(&p.Disabled, "disabled", false, "create the pool disabled")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			p.CIDR = args[0]
			added, err := eng.AddPool(c.Context(), p)
			if errors.Is(err, ipam.ErrInvalidCIDR) {
				// A block size out of range or host bits set: the
				// command line is wrong, not the datastore.
				return usageError{err.Error()}
			}
			if err != nil {
				return err
			}
			return out.print(a.stdout, added, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "pool %s added (block size /%d)\n", added.CIDR, added.BlockSize)
				return err
			})
		})
	}
	return c
}

func (a *app) poolListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "list",
		Short:   "List the IP pools with their block size, NAT and disabled flags",
		Example: "  calico-cnm pool list\n  calico-cnm pool list -o yaml",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			pools, err := eng.ListPools(c.Context())
			if err != nil {
				return err
			}
			return printList(a.stdout, out, pools, []column[ipam.Pool]{
				{header: "CIDR", value: func(p ipam.Pool) string { return p.CIDR }},
				{header: "BLOCK SIZE", value: func(p ipam.Pool) string { return "/" + strconv.Itoa(p.BlockSize) }},
				{header: "NAT OUTGOING", value: func(p ipam.Pool) string { return strconv.FormatBool(p.NATOutgoing) }},
				{header: "DISABLED", value: func(p ipam.Pool) string { return strconv.FormatBool(p.Disabled) }},
				{header: "BLOCKS", wide: true, value: func(p ipam.Pool) string { return blockCount(p) }},
			})
		})
	}
	return c
}

// blockCount is how many blocks a pool holds ("many" beyond 2^20).
func blockCount(p ipam.Pool) string {
	_, n, err := net.ParseCIDR(p.CIDR)
	if err != nil {
		return "-"
	}
	ones, _ := n.Mask.Size()
	bits := p.BlockSize - ones
	if bits < 0 || bits > 20 {
		return "many"
	}
	return strconv.Itoa(1 << bits)
}

func (a *app) poolDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete CIDR",
		Short:             "Delete a pool that has no address in use",
		Example:           "  calico-cnm pool delete 10.20.0.0/24",
		Args:              oneCIDR,
		ValidArgsFunction: a.completeFrom(poolCIDRs),
		RunE: func(c *cobra.Command, args []string) error {
			return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
				if err := eng.DeletePool(c.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "pool %s deleted\n", args[0])
				return nil
			})
		},
	}
}

// poolSetDisabledCmd is `pool disable` or `pool enable`.
func (a *app) poolSetDisabledCmd(verb string, disabled bool) *cobra.Command {
	short := "Stop new assignments from a pool (addresses in use stay)"
	if !disabled {
		short = "Resume assignments from a disabled pool"
	}
	return &cobra.Command{
		Use:               verb + " CIDR",
		Short:             short,
		Example:           "  calico-cnm pool " + verb + " 10.10.0.0/16",
		Args:              oneCIDR,
		ValidArgsFunction: a.completeFrom(poolCIDRs),
		RunE: func(c *cobra.Command, args []string) error {
			return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
				if err := eng.SetPoolDisabled(c.Context(), args[0], disabled); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "pool %s %sd\n", args[0], verb)
				return nil
			})
		},
	}
}
