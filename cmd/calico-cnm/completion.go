package main

import (
	"github.com/spf13/cobra"
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
