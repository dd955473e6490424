package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nodes"
	"github.com/calico-cnm/calico-cnm/routing"
)

// completionCmd writes the shell completion scripts cobra generates; the
// scripts call back `calico-cnm __complete` for flag values.
func completionCmd() *cobra.Command {
	shell := func(name, example string, gen func(c *cobra.Command) error) *cobra.Command {
		return &cobra.Command{
			Use:     name,
			Short:   "Print the " + name + " completion script",
			Example: example,
			Args:    noArgs,
			RunE:    func(c *cobra.Command, _ []string) error { return gen(c) },
		}
	}
	return group("completion", "Print a shell completion script (bash, zsh or fish)",
		`  calico-cnm completion bash > /etc/bash_completion.d/calico-cnm
  calico-cnm completion zsh > "${fpath[1]}/_calico-cnm"
  calico-cnm completion fish > ~/.config/fish/completions/calico-cnm.fish`,
		shell("bash", "  source <(calico-cnm completion bash)", func(c *cobra.Command) error {
			return c.Root().GenBashCompletionV2(c.OutOrStdout(), true)
		}),
		shell("zsh", "  calico-cnm completion zsh > \"${fpath[1]}/_calico-cnm\"", func(c *cobra.Command) error {
			return c.Root().GenZshCompletion(c.OutOrStdout())
		}),
		shell("fish", "  calico-cnm completion fish | source", func(c *cobra.Command) error {
			return c.Root().GenFishCompletion(c.OutOrStdout(), true)
		}),
	)
}

// completionTimeout bounds a datastore lookup behind a TAB: a shell must
// not hang on an etcd that does not answer.
const completionTimeout = 2 * time.Second

// completeFrom completes a command's first argument with names read from
// the datastore (pool CIDRs, node names, peer names).
func (a *app) completeFrom(list func(ctx context.Context, store *datastore.Store, eng *ipam.Engine) ([]string, error)) cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) != 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(c.Context(), completionTimeout)
		defer cancel()
		var names []string
		err := a.withStore(ctx, func(store *datastore.Store, eng *ipam.Engine) error {
			var err error
			names, err = list(ctx, store, eng)
			return err
		})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

func poolCIDRs(ctx context.Context, _ *datastore.Store, eng *ipam.Engine) ([]string, error) {
	pools, err := eng.ListPools(ctx)
	var out []string
	for _, p := range pools {
		out = append(out, p.CIDR)
	}
	return out, err
}

func nodeNames(ctx context.Context, store *datastore.Store, eng *ipam.Engine) ([]string, error) {
	list, err := nodes.List(ctx, store, eng)
	var out []string
	for _, n := range list {
		out = append(out, n.Name)
	}
	return out, err
}

func peerNames(ctx context.Context, store *datastore.Store, _ *ipam.Engine) ([]string, error) {
	peers, err := routing.ListPeers(ctx, store)
	var out []string
	for _, p := range peers {
		out = append(out, p.Name)
	}
	return out, err
}
