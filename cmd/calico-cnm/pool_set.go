package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/calico-cnm/calico-cnm/ipam"
)

// poolSet is `pool set CIDR --vxlan-mode M`: it changes a live pool; every
// daemon follows the record and re-plans its routes.
func (c *cli) poolSet(ctx context.Context, eng *ipam.Engine, cf *clientFlags, cidr, vxlanMode string) error {
	p, err := eng.SetPoolVXLANMode(ctx, cidr, vxlanMode)
	if errors.Is(err, ipam.ErrInvalidArgument) {
		return usageError{err.Error()}
	}
	if err != nil {
		return err
	}
	if cf.output == "json" {
		return c.printJSON(p)
	}
	fmt.Fprintf(c.stdout, "pool %s: vxlanMode %s\n", p.CIDR, p.VXLAN())
	return nil
}
