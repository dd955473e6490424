package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func (a *app) ipamConfigureCmd() *cobra.Command {
	var strict, auto bool
	var maxBlocks int
	c := &cobra.Command{
		Use:   "configure [--strict-affinity=true|false] [--max-blocks-per-host N] [--auto-allocate-blocks=true|false]",
		Short: "Show or change the cluster-wide IPAM settings",
		Long: `configure without flags shows the settings. strictAffinity forbids a host to
use addresses of another host's block; maxBlocksPerHost bounds the blocks a
host may own in the pools a request draws from (0: unlimited);
autoAllocateBlocks off means hosts claim no new blocks.`,
		Example: `  calico-cnm ipam configure
  calico-cnm ipam configure --strict-affinity=true --max-blocks-per-host 4
  calico-cnm ipam configure --auto-allocate-blocks=false -o json`,
		Args: noArgs,
	}
	c.Flags().BoolVar(&strict, "strict-affinity", false, "true: never borrow an address from another host's block")
	c.Flags().IntVar(&maxBlocks, "max-blocks-per-host", 0, "most blocks a host may own in the pools of one request (0: unlimited)")
	c.Flags().BoolVar(&auto, "auto-allocate-blocks", true, "false: hosts claim no new blocks")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		var ch ipam.ConfigChange
		if c.Flags().Changed("strict-affinity") {
			ch.StrictAffinity = &strict
		}
		if c.Flags().Changed("auto-allocate-blocks") {
			ch.AutoAllocateBlocks = &auto
		}
		if c.Flags().Changed("max-blocks-per-host") {
			if maxBlocks < 0 {
				return usagef("--max-blocks-per-host %d: use 0 (unlimited) or a positive number", maxBlocks)
			}
			ch.MaxBlocksPerHost = &maxBlocks
		}
		return a.withStore(c.Context(), func(_ *datastore.Store, eng *ipam.Engine) error {
			cfg, err := eng.GetConfig(c.Context())
			if !ch.Empty() && err == nil {
				cfg, err = eng.UpdateConfig(c.Context(), ch)
			}
			if errors.Is(err, ipam.ErrInvalidArgument) {
				return usageError{err.Error()}
			}
			if err != nil {
				return err
			}
			return out.print(a.stdout, cfg, func(w io.Writer) error {
				if !ch.Empty() {
					fmt.Fprintln(w, "IPAM configuration updated")
				}
				limit := "unlimited"
				if cfg.MaxBlocksPerHost > 0 {
					limit = fmt.Sprint(cfg.MaxBlocksPerHost)
				}
				_, err := fmt.Fprintf(w, "strictAffinity:      %t\nautoAllocateBlocks:  %t\nmaxBlocksPerHost:    %s\n", cfg.StrictAffinity, cfg.AutoAllocateBlocks, limit)
				return err
			})
		})
	}
	return c
}
