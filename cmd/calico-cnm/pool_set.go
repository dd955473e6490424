package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// poolSetCmd is `pool set CIDR --vxlan-mode M`: it changes a live pool;
// every daemon follows the record and re-plans its routes.
func (a *app) poolSetCmd() *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "set CIDR --vxlan-mode Never|Always|CrossSubnet",
		Short: "Change a live pool's encapsulation (vxlanMode)",
		Example: `  calico-cnm pool set 192.168.0.0/16 --vxlan-mode Always
  calico-cnm pool set 192.168.0.0/16 --vxlan-mode Never`,
		Args:              oneCIDR,
		ValidArgsFunction: a.completeFrom(poolCIDRs),
	}
	c.Flags().StringVar(&mode, "vxlan-mode", "", "Never, Always or CrossSubnet")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, args []string) error {
		if !c.Flags().Changed("vxlan-mode") {
			return usagef("pool set needs --vxlan-mode Never, Always or CrossSubnet")
		}
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			p, err := eng.SetPoolVXLANMode(c.Context(), args[0], mode)
			if errors.Is(err, ipam.ErrInvalidArgument) {
				return usageError{err.Error()}
			}
			if err != nil {
				return err
			}
			return out.print(a.stdout, p, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "pool %s: vxlanMode %s\n", p.CIDR, p.VXLAN())
				return err
			})
		})
	}
	return c
}
