package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

func (a *app) clusterCmd() *cobra.Command {
	return group("cluster", "Show or change the settings every node follows at once (WireGuard encryption)",
		`  calico-cnm cluster show
  calico-cnm cluster set --wireguard on --wireguard-mode required`,
		a.clusterShowCmd(), a.clusterSetCmd())
}

// clusterView is `cluster show`: the record with its defaults applied.
type clusterView struct {
	WireGuard     bool   `json:"wireguard"`
	WireGuardMode string `json:"wireguardMode"`
	WireGuardPort int    `json:"wireguardPort"`
}

func viewOf(cfg datastore.ClusterConfig) clusterView {
	mode, err := wireguard.ParseMode(cfg.WireGuardMode)
	if err != nil {
		mode = cfg.WireGuardMode
	}
	port := cfg.WireGuardPort
	if port == 0 {
		port = wireguard.DefaultPort
	}
	return clusterView{WireGuard: cfg.WireGuard, WireGuardMode: mode, WireGuardPort: port}
}

func writeClusterView(w io.Writer, v clusterView) error {
	_, err := fmt.Fprintf(w, "wireguard:       %s\nwireguard mode:  %s\nwireguard port:  %d\n", onOff(v.WireGuard), v.WireGuardMode, v.WireGuardPort)
	return err
}

func onOff(b bool) string { return map[bool]string{true: "on", false: "off"}[b] }

func (a *app) clusterShowCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "show",
		Short:   "Show the cluster-wide settings",
		Example: "  calico-cnm cluster show\n  calico-cnm cluster show -o yaml",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			cfg, _, err := wireguard.ReadConfig(c.Context(), store)
			if err != nil {
				return err
			}
			v := viewOf(cfg)
			return out.print(a.stdout, v, func(w io.Writer) error { return writeClusterView(w, v) })
		})
	}
	return c
}

func (a *app) clusterSetCmd() *cobra.Command {
	var on, mode string
	var port int
	c := &cobra.Command{
		Use:   "set [--wireguard on|off] [--wireguard-mode required|preferred] [--wireguard-port N]",
		Short: "Change the cluster-wide settings; every daemon follows at once",
		Long: `set changes the settings every node's daemon follows without a restart.

--wireguard on encrypts container traffic between hosts: each node makes a key
pair (the private key stays in its state directory), publishes its public key
in its node record, and routes the other nodes' blocks through wireguard.cali.
In required mode (the default) traffic to a node without a valid key is
dropped; preferred sends it in clear. Containers created while WireGuard is on
get an MTU 60 bytes below the uplink's (110 in a VXLAN pool).`,
		Example: `  calico-cnm cluster set --wireguard on
  calico-cnm cluster set --wireguard-mode preferred
  calico-cnm cluster set --wireguard off`,
		Args: noArgs,
	}
	c.Flags().StringVar(&on, "wireguard", "", "encrypt container traffic between hosts: on or off")
	c.Flags().StringVar(&mode, "wireguard-mode", "", "required (no clear text to a node without a valid key) or preferred (clear text to such nodes)")
	c.Flags().IntVar(&port, "wireguard-port", 0, "UDP port of every node's WireGuard device (default 51820)")
	_ = c.RegisterFlagCompletionFunc("wireguard", cobra.FixedCompletions([]string{"on", "off"}, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("wireguard-mode", cobra.FixedCompletions([]string{wireguard.ModeRequired, wireguard.ModePreferred}, cobra.ShellCompDirectiveNoFileComp))
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		var ch wireguard.Change
		switch on {
		case "":
		case "on", "off":
			ch.Enabled = boolPtr(on == "on")
		default:
			return usagef("--wireguard %q: use on or off", on)
		}
		if c.Flags().Changed("wireguard-mode") {
			ch.Mode = &mode
		}
		if c.Flags().Changed("wireguard-port") {
			ch.Port = &port
		}
		if ch == (wireguard.Change{}) {
			return usagef("cluster set needs a setting: --wireguard, --wireguard-mode or --wireguard-port")
		}
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			cfg, err := wireguard.Configure(c.Context(), store, ch)
			if errors.Is(err, wireguard.ErrInvalid) {
				return usageError{err.Error()}
			}
			if err != nil {
				return err
			}
			v := viewOf(cfg)
			return out.print(a.stdout, v, func(w io.Writer) error {
				fmt.Fprintln(w, "cluster configuration updated")
				return writeClusterView(w, v)
			})
		})
	}
	return c
}

// nodeRotateKeyCmd asks the local daemon for a new WireGuard key pair.
func (a *app) nodeRotateKeyCmd() *cobra.Command {
	var stateDir string
	c := &cobra.Command{
		Use:   "rotate-key",
		Short: "Replace this host's WireGuard key pair (asks the local daemon)",
		Long: `rotate-key makes the daemon on this host generate a new WireGuard key pair,
save the private key in its state directory and publish the public key in its
node record; the other nodes follow at once, and connections resume at the
next handshake.`,
		Example: "  calico-cnm node rotate-key\n  calico-cnm node rotate-key --state-dir /var/lib/calico-cnm",
		Args:    noArgs,
	}
	c.Flags().StringVar(&stateDir, "state-dir", plugin.DefaultConfig(a.getenv).StateDir, "the daemon's state dir, where its WireGuard socket is (env "+plugin.EnvStateDir+")")
	c.RunE = func(c *cobra.Command, _ []string) error {
		ctx, cancel := context.WithTimeout(c.Context(), a.global.ds.RequestTimeout)
		defer cancel()
		key, err := wireguard.RotateKey(ctx, filepath.Join(stateDir, wireguard.SocketName))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "new WireGuard public key: %s\n", key)
		return err
	}
	return c
}

// writeWireGuardStatus is the WireGuard part of `node status`.
func writeWireGuardStatus(w io.Writer, st *wireguard.Status) error {
	if st == nil {
		return nil
	}
	fmt.Fprintln(w)
	if !st.Enabled {
		_, err := fmt.Fprintln(w, "WireGuard: off (calico-cnm cluster set --wireguard on)")
		return err
	}
	if st.Device == "" {
		_, err := fmt.Fprintln(w, "WireGuard: on, device not ready yet")
		return err
	}
	fmt.Fprintf(w, "WireGuard: device %s (%s), mode %s, listening on %s, MTU %d\npublic key: %s\n", st.Device, st.Implementation, st.Mode, st.Address, st.MTU, st.PublicKey)
	var rows [][]string
	for _, p := range st.Peers {
		hs := "never"
		if !p.LastHandshake.IsZero() {
			hs = time.Since(p.LastHandshake).Round(time.Second).String() + " ago"
		}
		rows = append(rows, []string{orDash(p.Node), p.PublicKey, p.Endpoint, hs, strconv.FormatInt(p.RxBytes, 10), strconv.FormatInt(p.TxBytes, 10), orDash(strings.Join(p.AllowedIPs, " "))})
	}
	if err := writeTable(w, []string{"PEER", "PUBLIC KEY", "ENDPOINT", "LAST HANDSHAKE", "RECEIVED", "SENT", "ALLOWED IPS"}, rows); err != nil {
		return err
	}
	for _, u := range st.Unencrypted {
		fmt.Fprintf(w, "no peer for %s: %s (its traffic is %s)\n", u.Node, u.Reason, u.Traffic)
	}
	return nil
}

// nodeStatusView is `node status -o json|yaml`: the routing status with
// the WireGuard part beside it.
type nodeStatusView struct {
	routing.Status
	WireGuard *wireguard.Status `json:"wireguard,omitempty"`
}

// withWireGuardStatus adds the WireGuard status of the daemon whose state
// dir is stateDir, when its WireGuard socket answers.
func (a *app) withWireGuardStatus(ctx context.Context, st routing.Status, stateDir string) nodeStatusView {
	ctx, cancel := context.WithTimeout(ctx, a.global.ds.RequestTimeout)
	defer cancel()
	v := nodeStatusView{Status: st}
	if wg, err := wireguard.FetchStatus(ctx, filepath.Join(stateDir, wireguard.SocketName)); err == nil {
		v.WireGuard = &wg
	}
	return v
}
