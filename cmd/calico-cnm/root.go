package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

// globalFlags are the settings every command may need: where the datastore
// is, and how much to log.
type globalFlags struct {
	endpoints string
	ds        datastore.Config // TLS files, prefix, timeout
	logLevel  string
	// logLevelSet: --log-level was given; the operator commands log only
	// warnings otherwise (serve logs at the level whatever it is).
	logLevelSet func() bool
}

// newRootCmd builds the whole command tree for one invocation.
func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "calico-cnm",
		Short: "Calico networking and IPAM for Docker (libnetwork remote drivers)",
		Long: `calico-cnm is the Docker network driver "calico" and IPAM driver "calico-ipam"
(calico-cnm serve), and the operator CLI for their datastore: IP pools, IPAM
blocks, networks, nodes and BGP.`,
		Example: `  calico-cnm serve --bgp
  calico-cnm pool add 10.10.0.0/16 --nat-outgoing
  calico-cnm ipam show -o yaml
  calico-cnm completion bash > /etc/bash_completion.d/calico-cnm`,
		Version:       Version,
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a command: the usage on stderr, exit 2.
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				c.SetOut(a.stderr)
				_ = c.Usage()
				return usagef("no command given")
			}
			return unknownSubcommand(c, args[0])
		},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetVersionTemplate("calico-cnm {{.Version}}\n")
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	a.addGlobalFlags(root.PersistentFlags())
	root.SetGlobalNormalizationFunc(flagAliases)

	root.AddCommand(
		a.serveCmd(),
		a.poolCmd(),
		a.ipamCmd(),
		a.networkCmd(),
		a.bgpCmd(),
		a.nodeCmd(),
		a.clusterCmd(),
		a.datastoreCmd(),
		a.versionCmd(),
		a.diagsCmd(),
		a.applyCmd(),
		a.getCmd(),
		a.deleteCmd(),
		completionCmd(),
	)
	root.InitDefaultHelpCmd()
	markRunErrors(root)
	return root
}

// flagAliases keeps the operator commands' historical --timeout working:
// it is the same bound as --etcd-timeout.
func flagAliases(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	if name == "timeout" {
		name = "etcd-timeout"
	}
	return pflag.NormalizedName(name)
}

func (a *app) addGlobalFlags(fs *pflag.FlagSet) {
	base := plugin.DefaultConfig(a.getenv)
	g := &a.global
	g.ds = base.Datastore
	fs.StringVar(&g.endpoints, "etcd-endpoints", strings.Join(base.Datastore.Endpoints, ","),
		"comma-separated etcd URLs (env "+plugin.EnvEtcdEndpoints+"); empty: serve runs an embedded member, the other commands use the local one through <state-dir>/"+datastore.EmbeddedClientSocket+" (env "+plugin.EnvStateDir+"; root only), else at "+datastore.LoopbackClientURL)
	fs.StringVar(&g.ds.CACertFile, "etcd-ca-cert-file", g.ds.CACertFile, "CA certificate for etcd TLS (env "+plugin.EnvEtcdCA+")")
	fs.StringVar(&g.ds.CertFile, "etcd-cert-file", g.ds.CertFile, "client certificate for etcd TLS (env "+plugin.EnvEtcdCert+")")
	fs.StringVar(&g.ds.KeyFile, "etcd-key-file", g.ds.KeyFile, "client key for etcd TLS (env "+plugin.EnvEtcdKey+")")
	fs.StringVar(&g.ds.Prefix, "etcd-prefix", g.ds.Prefix, "key prefix in etcd (env "+plugin.EnvEtcdPrefix+")")
	fs.DurationVar(&g.ds.RequestTimeout, "etcd-timeout", datastore.DefaultRequestTimeout, "bound on every datastore call (alias --timeout)")
	fs.StringVar(&g.logLevel, "log-level", base.LogLevel, "debug, info, warn or error (env "+plugin.EnvLogLevel+"); the operator commands log warnings only unless it is given")
	g.logLevelSet = func() bool { return fs.Changed("log-level") }
}

// openStore connects to the datastore the global flags name.
func (a *app) openStore(ctx context.Context) (*datastore.Store, error) {
	cfg := a.global.ds
	cfg.Endpoints = plugin.SplitEndpoints(a.global.endpoints)
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = []string{datastore.LocalEndpoint(plugin.DefaultConfig(a.getenv).StateDir)}
	}
	cfg.Embedded = false
	return datastore.Open(ctx, cfg, nil)
}

// withStore runs fn with an open datastore and an IPAM engine on it.
func (a *app) withStore(ctx context.Context, fn func(*datastore.Store, *ipam.Engine) error) error {
	store, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	// A newer calico-cnm's records would be misread. Only a format the
	// store answered counts: an unreachable datastore fails the command
	// itself, with its own message.
	if err := store.CheckFormat(ctx); errors.Is(err, datastore.ErrFormatTooNew) {
		return err
	}
	return fn(store, ipam.New(store, ipam.Options{Log: a.log()}))
}

// log is the logger of one operator command: the command prints its own
// result on stdout, so only warnings (on the command's stderr, not the
// process's) are worth showing unless --log-level says otherwise.
func (a *app) log() *logrus.Logger {
	l := newLogger(a.stderr)
	l.SetLevel(logrus.WarnLevel)
	if a.global.logLevelSet != nil && a.global.logLevelSet() {
		if lvl, err := logrus.ParseLevel(a.global.logLevel); err == nil {
			l.SetLevel(lvl)
		}
	}
	return l
}

// group is a command that only holds subcommands: without one, or with an
// unknown one, it is a usage error (cobra would print help and exit 0).
func group(use, short, example string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.ArbitraryArgs,
		// "calico-cnm pool", not "calico-cnm pool [flags]": a group only
		// has subcommands.
		DisableFlagsInUseLine: true,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs a subcommand: %s", cmdName(c), subNames(c))
			}
			if args[0] == "help" { // `bgp help`, as `bgp --help`
				return c.Help()
			}
			return unknownSubcommand(c, args[0])
		},
	}
	c.AddCommand(subs...)
	return c
}

func unknownSubcommand(c *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown %s %q", "command", name)
	if c.HasParent() {
		msg = fmt.Sprintf("unknown %s subcommand %q: use %s", cmdName(c), name, subNames(c))
	}
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2
	}
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	} else if !c.HasParent() {
		msg += " (try `calico-cnm --help`)"
	}
	return usageError{msg}
}

// cmdName is the command path without the program name: "bgp peer add".
func cmdName(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}

// subNames lists c's subcommands: "add, list or delete".
func subNames(c *cobra.Command) string {
	var names []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// noArgs refuses positional arguments.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) != 0 {
		return usagef("%s takes no arguments, got %q", cmdName(c), args)
	}
	return nil
}

// markRunErrors tags the errors of every command's own work, so that exit
// codes can tell them from cobra's command-line errors. It runs once the
// tree is built, so commands added anywhere are covered.
func markRunErrors(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(c *cobra.Command, args []string) error {
			if err := run(c, args); err != nil {
				return runError{err}
			}
			return nil
		}
	}
	for _, s := range c.Commands() {
		markRunErrors(s)
	}
}
