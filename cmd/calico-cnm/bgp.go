package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

func (a *app) bgpCmd() *cobra.Command {
	peer := group("peer", "Manage explicit BGP peers (routers, external reflectors)",
		`  calico-cnm bgp peer add tor1 --peer-ip 10.0.0.254 --as-number 65000
  calico-cnm bgp peer list`,
		a.bgpPeerAddCmd(), a.bgpPeerListCmd(), a.bgpPeerDeleteCmd())
	return group("bgp", "Manage BGP peers and settings (the daemons follow changes at once)",
		`  calico-cnm bgp config --asn 64512 --mesh off
  calico-cnm bgp peer add tor1 --peer-ip 10.0.0.254 --as-number 65000 --password-file /root/tor1.pw`,
		peer, a.bgpConfigCmd())
}

// settingError turns routing's validation errors into usage errors: the
// command line named something malformed.
func settingError(err error) error {
	if errors.Is(err, routing.ErrInvalid) {
		return usageError{err.Error()}
	}
	return err
}

func (a *app) bgpPeerAddCmd() *cobra.Command {
	var rec datastore.BGPPeer
	var pwFile, pwEnv string
	c := &cobra.Command{
		Use:   "add NAME --peer-ip IP --as-number N",
		Short: "Add a BGP peer for every node, or for one node",
		Long: `add records a peer the daemons connect to. The TCP MD5 password is read from a
file or an environment variable (and stored in etcd), or kept out of etcd as a
secret reference (a file of that name in each node's --bgp-secrets-dir);
never from the command line, never printed.`,
		Example: `  calico-cnm bgp peer add tor1 --peer-ip 10.0.0.254 --as-number 65000
  TOR_PW=s3cret calico-cnm bgp peer add tor2 --peer-ip 10.0.1.254 --as-number 65000 --node host2 --password-env TOR_PW
  calico-cnm bgp peer add rr --peer-ip 10.0.0.253 --as-number 65000 --password-secret rr-key`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("bgp peer add needs exactly one peer name, e.g. `calico-cnm bgp peer add tor1 --peer-ip 10.0.0.254 --as-number 65000`")
			}
			return nil
		},
	}
	c.Flags().StringVar(&rec.PeerIP, "peer-ip", "", "the peer's IPv4 address")
	c.Flags().Var(asnFlag{&rec.ASN}, "as-number", "the peer's AS number")
	c.Flags().StringVar(&rec.Node, "node", "", "peer with this node only (default: every node)")
	c.Flags().StringVar(&pwFile, "password-file", "", "read the TCP MD5 password from this file (first line)")
	c.Flags().StringVar(&pwEnv, "password-env", "", "read the TCP MD5 password from this environment variable")
	c.Flags().StringVar(&rec.PasswordSecret, "password-secret", "", "the TCP MD5 password is in file NAME of each node's --bgp-secrets-dir; the datastore holds only the name")
	c.RunE = func(c *cobra.Command, args []string) error {
		rec.Name = args[0]
		if err := a.completePeer(&rec, pwFile, pwEnv); err != nil {
			return err
		}
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			err := routing.AddPeer(c.Context(), store, rec)
			if errors.Is(err, routing.ErrPeerExists) {
				return fmt.Errorf("BGP peer %s already exists: delete it first to change it", rec.Name)
			}
			if err != nil {
				return settingError(err)
			}
			scope := "every node"
			if rec.Node != "" {
				scope = "node " + rec.Node
			}
			auth := ""
			switch {
			case rec.Password != "":
				auth = ", with a TCP MD5 password"
			case rec.PasswordSecret != "":
				auth = ", with the TCP MD5 password of secret " + rec.PasswordSecret
			}
			fmt.Fprintf(a.stdout, "BGP peer %s added: %s AS %d, for %s%s\n", rec.Name, rec.PeerIP, rec.ASN, scope, auth)
			return nil
		})
	}
	return c
}

// completePeer checks the flags of `bgp peer add` and reads the password,
// before anything is written.
func (a *app) completePeer(rec *datastore.BGPPeer, pwFile, pwEnv string) error {
	if ip, err := netip.ParseAddr(rec.PeerIP); err != nil || !ip.Is4() {
		return usagef("bgp peer add needs --peer-ip with an IPv4 address, got %q", rec.PeerIP)
	}
	if rec.ASN == 0 {
		return usagef("bgp peer add needs --as-number")
	}
	if rec.PasswordSecret != "" && (pwFile != "" || pwEnv != "") {
		return usagef("use --password-secret, or --password-file/--password-env, not both")
	}
	pw, err := a.readPassword(pwFile, pwEnv)
	if err != nil {
		return err
	}
	rec.Password = pw
	return settingError(routing.ValidatePeer(*rec))
}

// readPassword reads the MD5 password from a file or an environment
// variable: never from the command line, where ps and shell history would
// show it.
func (a *app) readPassword(file, env string) (string, error) {
	if file != "" && env != "" {
		return "", usagef("use --password-file or --password-env, not both")
	}
	var pw string
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("reading the password file: %w", err)
		}
		pw, _, _ = strings.Cut(string(b), "\n")
		pw = strings.TrimRight(pw, "\r")
	case env != "":
		pw = a.getenv(env)
		if pw == "" {
			return "", usagef("environment variable %s is empty or unset", env)
		}
	default:
		return "", nil
	}
	if pw == "" {
		return "", usagef("the password is empty")
	}
	return pw, nil
}

func (a *app) bgpPeerListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "list",
		Short:   "List the BGP peers (passwords shown as yes, secret NAME or -)",
		Example: "  calico-cnm bgp peer list\n  calico-cnm bgp peer list -o json",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			peers, err := routing.ListPeers(c.Context(), store)
			if err != nil {
				return err
			}
			return printList(a.stdout, out, peers, []column[routing.PeerInfo]{
				{header: "NAME", value: func(p routing.PeerInfo) string { return p.Name }},
				{header: "PEER IP", value: func(p routing.PeerInfo) string { return p.PeerIP }},
				{header: "AS", value: func(p routing.PeerInfo) string { return strconv.FormatUint(uint64(p.ASN), 10) }},
				{header: "NODE", value: func(p routing.PeerInfo) string {
					if p.Node == "" {
						return "(global)"
					}
					return p.Node
				}},
				{header: "PASSWORD", value: func(p routing.PeerInfo) string {
					switch {
					case p.PasswordSecret != "":
						return "secret " + p.PasswordSecret
					case p.Password:
						return "yes"
					}
					return "-"
				}},
			})
		})
	}
	return c
}

func (a *app) bgpPeerDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME",
		Short:             "Remove a BGP peer",
		Example:           "  calico-cnm bgp peer delete tor1",
		ValidArgsFunction: a.completeFrom(peerNames),
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("bgp peer delete needs exactly one peer name, e.g. `calico-cnm bgp peer delete tor1`")
			}
			return settingError(routing.ValidateName("peer", args[0]))
		},
		RunE: func(c *cobra.Command, args []string) error {
			return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
				err := routing.DeletePeer(c.Context(), store, args[0])
				if errors.Is(err, routing.ErrPeerNotFound) {
					return fmt.Errorf("no BGP peer %s (see `calico-cnm bgp peer list`)", args[0])
				}
				if err != nil {
					return settingError(err)
				}
				fmt.Fprintf(a.stdout, "BGP peer %s deleted\n", args[0])
				return nil
			})
		},
	}
}

// bgpConfigFlags are the settings `bgp config` may change.
type bgpConfigFlags struct {
	asn     uint32
	mesh    string
	node    string
	rr      string
	cluster string
}

// parse checks the flag combination and turns it into the changes to make.
func (f *bgpConfigFlags) parse() (routing.ClusterChange, routing.NodeChange, error) {
	cc := routing.ClusterChange{}
	nc := routing.NodeChange{ClusterID: f.cluster}
	switch strings.ToLower(f.mesh) {
	case "":
	case "on", "true":
		cc.Mesh = boolPtr(true)
	case "off", "false":
		cc.Mesh = boolPtr(false)
	default:
		return cc, nc, usagef("--mesh %q: use on or off", f.mesh)
	}
	if f.rr != "" {
		b, err := strconv.ParseBool(f.rr)
		if err != nil {
			return cc, nc, usagef("--route-reflector %q: use true or false", f.rr)
		}
		nc.RouteReflector = &b
	}
	if f.cluster != "" {
		if ip, err := netip.ParseAddr(f.cluster); err != nil || !ip.Is4() {
			return cc, nc, usagef("--cluster-id %q: use an IPv4 address, e.g. 1.0.0.1", f.cluster)
		}
	}
	if f.node == "" {
		if nc.RouteReflector != nil || f.cluster != "" {
			return cc, nc, usagef("--route-reflector and --cluster-id need --node")
		}
		cc.ASN = f.asn
		return cc, nc, nil
	}
	if cc.Mesh != nil {
		return cc, nc, usagef("--mesh is cluster-wide: use it without --node")
	}
	nc.ASN = f.asn
	return cc, nc, settingError(routing.ValidateName("node", f.node))
}

func (a *app) bgpConfigCmd() *cobra.Command {
	var f bgpConfigFlags
	c := &cobra.Command{
		Use:   "config [--asn N] [--mesh on|off] | --node NODE [--asn N] [--route-reflector=true|false] [--cluster-id IP]",
		Short: "Show or change the cluster's AS and mesh, or a node's AS and route-reflector role",
		Long: `config without flags shows the settings. With the mesh off, nodes peer only
with the route reflectors, and the reflectors with everyone.`,
		Example: `  calico-cnm bgp config
  calico-cnm bgp config --asn 64512 --mesh off
  calico-cnm bgp config --node host1 --route-reflector=true --cluster-id 1.0.0.1`,
		Args: noArgs,
	}
	c.Flags().Var(asnFlag{&f.asn}, "asn", "AS number: the cluster default, or with --node that node's own")
	c.Flags().StringVar(&f.mesh, "mesh", "", "node-to-node mesh: on or off")
	c.Flags().StringVar(&f.node, "node", "", "change this node's settings")
	c.Flags().StringVar(&f.rr, "route-reflector", "", "with --node: true makes the node a route reflector, false a plain node")
	c.Flags().StringVar(&f.cluster, "cluster-id", "", "with --node: the reflector's cluster id (an IPv4 address; default: the node's address)")
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		cc, nc, err := f.parse()
		if err != nil {
			return err
		}
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			changed, err := applyBGPConfig(c.Context(), store, f.node, cc, nc)
			if err != nil {
				return settingError(err)
			}
			view, err := routing.GetConfig(c.Context(), store)
			if err != nil {
				return err
			}
			return out.print(a.stdout, view, func(w io.Writer) error {
				if changed {
					fmt.Fprintln(w, "BGP configuration updated")
				}
				return writeBGPConfig(w, view)
			})
		})
	}
	return c
}

// applyBGPConfig writes the changes, if any; changed says whether there were.
func applyBGPConfig(ctx context.Context, store *datastore.Store, node string, cc routing.ClusterChange, nc routing.NodeChange) (bool, error) {
	switch {
	case node != "" && (nc.ASN != 0 || nc.RouteReflector != nil || nc.ClusterID != ""):
		return true, routing.SetNodeConfig(ctx, store, node, nc)
	case node == "" && (cc.ASN != 0 || cc.Mesh != nil):
		return true, routing.SetClusterConfig(ctx, store, cc)
	}
	return false, nil
}

func writeBGPConfig(w io.Writer, view routing.ConfigView) error {
	fmt.Fprintf(w, "default AS number:   %d\nnode-to-node mesh:   %s\n\n", view.ASN, map[bool]string{true: "on", false: "off"}[view.NodeToNodeMesh])
	var rows [][]string
	for _, n := range view.Nodes {
		rows = append(rows, []string{n.Name, orDash(n.IPv4), strconv.FormatUint(uint64(n.ASN), 10), strconv.FormatBool(n.RouteReflector), orDash(n.ClusterID)})
	}
	return writeTable(w, []string{"NODE", "ADDRESS", "AS", "ROUTE REFLECTOR", "CLUSTER ID"}, rows)
}

func boolPtr(b bool) *bool { return &b }
