package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/routing"
)

const bgpUsage = `calico-cnm bgp: BGP peers and settings (the daemons follow changes at once)

  bgp peer add NAME --peer-ip IP --as-number N [--node NODE] [--password-file F | --password-env VAR]
  bgp peer list [-o json]
  bgp peer delete NAME
  bgp config                                  show the settings
  bgp config [--asn N] [--mesh on|off]        cluster-wide default AS number, node-to-node mesh
  bgp config --node NODE [--asn N] [--route-reflector=true|false] [--cluster-id ID]
`

func (c *cli) bgp(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("bgp needs a subcommand: peer or config\n%s", bgpUsage)
	}
	switch args[0] {
	case "peer":
		return c.bgpPeer(ctx, args[1:])
	case "config":
		return c.bgpConfig(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(c.stdout, bgpUsage)
		return nil
	}
	return usagef("unknown bgp subcommand %q: use peer or config", args[0])
}

// peerRow is a peer as listed: the password is never shown, only whether
// there is one.
type peerRow struct {
	Name     string `json:"name"`
	PeerIP   string `json:"peerIP"`
	ASN      uint32 `json:"asn"`
	Node     string `json:"node,omitempty"`
	Password bool   `json:"password"`
	// PasswordSecret is the secret's name (never its content).
	PasswordSecret string `json:"passwordSecret,omitempty"`
}

func validName(kind, name string) error {
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return usagef("%s name %q: use letters, digits, '-', '.' or '_' (no '/' or spaces)", kind, name)
	}
	return nil
}

func (c *cli) bgpPeer(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("bgp peer needs a subcommand: add, list or delete")
	}
	sub := args[0]
	fs, cf := c.newFlagSet("bgp peer " + sub)
	peerIP := fs.String("peer-ip", "", "with add: the peer's IPv4 address")
	var asn uint32
	fs.Var(asnFlag{&asn}, "as-number", "with add: the peer's AS number")
	node := fs.String("node", "", "with add: peer with this node only (default: every node)")
	pwFile := fs.String("password-file", "", "with add: read the TCP MD5 password from this file (first line)")
	pwEnv := fs.String("password-env", "", "with add: read the TCP MD5 password from this environment variable")
	pwSecret := fs.String("password-secret", "", "with add: the TCP MD5 password is in file NAME of each node's --bgp-secrets-dir; the datastore holds only the name")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	switch sub {
	case "add", "delete":
		if len(pos) != 1 {
			return usagef("bgp peer %s needs exactly one peer name, e.g. 'calico-cnm bgp peer %s tor1'", sub, sub)
		}
		if err := validName("peer", pos[0]); err != nil {
			return err
		}
	case "list":
		if len(pos) != 0 {
			return usagef("bgp peer list takes no arguments")
		}
	default:
		return usagef("unknown bgp peer subcommand %q: use add, list or delete", sub)
	}
	var rec datastore.BGPPeer
	if sub == "add" {
		a, err := netip.ParseAddr(*peerIP)
		if err != nil || !a.Is4() {
			return usagef("bgp peer add needs --peer-ip with an IPv4 address, got %q", *peerIP)
		}
		if asn == 0 {
			return usagef("bgp peer add needs --as-number")
		}
		if *node != "" {
			if err := validName("node", *node); err != nil {
				return err
			}
		}
		if *pwSecret != "" && (*pwFile != "" || *pwEnv != "") {
			return usagef("use --password-secret, or --password-file/--password-env, not both")
		}
		if *pwSecret != "" {
			if err := validName("secret", *pwSecret); err != nil {
				return err
			}
			if *pwSecret == "." || *pwSecret == ".." {
				return usagef("secret name %q: name a file in the secrets directory", *pwSecret)
			}
		}
		pw, err := c.readPassword(*pwFile, *pwEnv)
		if err != nil {
			return err
		}
		rec = datastore.BGPPeer{Name: pos[0], PeerIP: a.String(), ASN: asn, Node: *node, Password: pw, PasswordSecret: *pwSecret}
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	switch sub {
	case "add":
		err := store.Txn(ctx, datastore.Create(datastore.BGPPeerKey(rec.Name), datastore.MustJSON(rec)))
		if errors.Is(err, datastore.ErrConflict) {
			return fmt.Errorf("BGP peer %s already exists: delete it first to change it", rec.Name)
		}
		if err != nil {
			return err
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
		fmt.Fprintf(c.stdout, "BGP peer %s added: %s AS %d, for %s%s\n", rec.Name, rec.PeerIP, rec.ASN, scope, auth)
		return nil
	case "delete":
		kv, err := store.Get(ctx, datastore.BGPPeerKey(pos[0]))
		if errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("no BGP peer %s (see `calico-cnm bgp peer list`)", pos[0])
		}
		if err != nil {
			return err
		}
		if err := store.Txn(ctx, datastore.Delete(kv.Key, kv.ModRevision)); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "BGP peer %s deleted\n", pos[0])
		return nil
	}
	kvs, err := store.List(ctx, datastore.BGPPeersPrefix)
	if err != nil {
		return err
	}
	rows := []peerRow{}
	for _, kv := range kvs {
		var p datastore.BGPPeer
		if json.Unmarshal(kv.Value, &p) != nil {
			continue
		}
		rows = append(rows, peerRow{Name: p.Name, PeerIP: p.PeerIP, ASN: p.ASN, Node: p.Node, Password: p.Password != "" || p.PasswordSecret != "", PasswordSecret: p.PasswordSecret})
	}
	if cf.output == "json" {
		return c.printJSON(rows)
	}
	var table [][]string
	for _, r := range rows {
		node := r.Node
		if node == "" {
			node = "(global)"
		}
		pw := map[bool]string{true: "yes", false: "-"}[r.Password]
		if r.PasswordSecret != "" {
			pw = "secret " + r.PasswordSecret
		}
		table = append(table, []string{r.Name, r.PeerIP, strconv.FormatUint(uint64(r.ASN), 10), node, pw})
	}
	return c.table("NAME\tPEER IP\tAS\tNODE\tPASSWORD", table)
}

// readPassword reads the MD5 password from a file or an environment
// variable: never from the command line, where ps and shell history would
// show it.
func (c *cli) readPassword(file, env string) (string, error) {
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
		pw = c.getenv(env)
		if pw == "" {
			return "", usagef("environment variable %s is empty or unset", env)
		}
	default:
		return "", nil
	}
	if pw == "" {
		return "", usagef("the password is empty")
	}
	if len(pw) > 80 {
		return "", usagef("the password is longer than 80 characters, the TCP MD5 limit")
	}
	return pw, nil
}

// bgpConfigView is what `bgp config` shows.
type bgpConfigView struct {
	ASN            uint32     `json:"asn"`
	NodeToNodeMesh bool       `json:"nodeToNodeMesh"`
	Nodes          []nodeView `json:"nodes"`
}

type nodeView struct {
	Name           string `json:"name"`
	IPv4           string `json:"ipv4,omitempty"`
	ASN            uint32 `json:"asn"` // effective
	RouteReflector bool   `json:"routeReflector"`
	ClusterID      string `json:"clusterID,omitempty"`
}

func (c *cli) bgpConfig(ctx context.Context, args []string) error {
	fs, cf := c.newFlagSet("bgp config")
	var asn uint32
	fs.Var(asnFlag{&asn}, "asn", "AS number: the cluster default, or with --node that node's own")
	mesh := fs.String("mesh", "", "node-to-node mesh: on or off")
	node := fs.String("node", "", "change this node's settings")
	rr := fs.String("route-reflector", "", "with --node: true makes the node a route reflector, false a plain node")
	cluster := fs.String("cluster-id", "", "with --node: the reflector's cluster id (an IPv4 address; default: the node's address)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("bgp config takes no positional arguments, got %q", pos)
	}
	var meshVal *bool
	switch strings.ToLower(*mesh) {
	case "":
	case "on", "true":
		meshVal = boolPtr(true)
	case "off", "false":
		meshVal = boolPtr(false)
	default:
		return usagef("--mesh %q: use on or off", *mesh)
	}
	var rrVal *bool
	if *rr != "" {
		b, err := strconv.ParseBool(*rr)
		if err != nil {
			return usagef("--route-reflector %q: use true or false", *rr)
		}
		rrVal = &b
	}
	if *cluster != "" {
		if a, err := netip.ParseAddr(*cluster); err != nil || !a.Is4() {
			return usagef("--cluster-id %q: use an IPv4 address, e.g. 1.0.0.1", *cluster)
		}
	}
	if *node == "" && (rrVal != nil || *cluster != "") {
		return usagef("--route-reflector and --cluster-id need --node")
	}
	if *node != "" {
		if err := validName("node", *node); err != nil {
			return err
		}
		if meshVal != nil {
			return usagef("--mesh is cluster-wide: use it without --node")
		}
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	changed := false
	if *node != "" && (asn != 0 || rrVal != nil || *cluster != "") {
		changed = true
		err := store.Retry(ctx, func(ctx context.Context) error {
			var n datastore.Node
			rev, err := store.GetJSON(ctx, datastore.NodeKey(*node), &n)
			if err != nil && !errors.Is(err, datastore.ErrNotFound) {
				return err
			}
			// A node that has not started yet gets its record now; its
			// daemon keeps these settings when it registers.
			n.Name = *node
			if asn != 0 {
				n.ASN = asn
			}
			if rrVal != nil {
				n.RouteReflector = *rrVal
			}
			if *cluster != "" {
				n.ClusterID = *cluster
			}
			return store.Txn(ctx, datastore.Write(datastore.NodeKey(*node), datastore.MustJSON(n), rev))
		})
		if err != nil {
			return err
		}
	}
	if *node == "" && (asn != 0 || meshVal != nil) {
		changed = true
		err := store.Retry(ctx, func(ctx context.Context) error {
			var cfg datastore.BGPConfig
			rev, err := store.GetJSON(ctx, datastore.BGPConfigKey, &cfg)
			if err != nil && !errors.Is(err, datastore.ErrNotFound) {
				return err
			}
			if asn != 0 {
				cfg.ASN = asn
			}
			if meshVal != nil {
				cfg.NodeToNodeMesh = meshVal
			}
			return store.Txn(ctx, datastore.Write(datastore.BGPConfigKey, datastore.MustJSON(cfg), rev))
		})
		if err != nil {
			return err
		}
	}
	view, err := readBGPConfig(ctx, store)
	if err != nil {
		return err
	}
	if cf.output == "json" {
		return c.printJSON(view)
	}
	if changed {
		fmt.Fprintln(c.stdout, "BGP configuration updated")
	}
	fmt.Fprintf(c.stdout, "default AS number:   %d\nnode-to-node mesh:   %s\n\n", view.ASN, map[bool]string{true: "on", false: "off"}[view.NodeToNodeMesh])
	var rows [][]string
	for _, n := range view.Nodes {
		rows = append(rows, []string{n.Name, orDash(n.IPv4), strconv.FormatUint(uint64(n.ASN), 10), strconv.FormatBool(n.RouteReflector), orDash(n.ClusterID)})
	}
	return c.table("NODE\tADDRESS\tAS\tROUTE REFLECTOR\tCLUSTER ID", rows)
}

func boolPtr(b bool) *bool { return &b }

func readBGPConfig(ctx context.Context, store *datastore.Store) (bgpConfigView, error) {
	var cfg datastore.BGPConfig
	if _, err := store.GetJSON(ctx, datastore.BGPConfigKey, &cfg); err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return bgpConfigView{}, err
	}
	view := bgpConfigView{ASN: routing.EffectiveASN(datastore.Node{}, cfg), NodeToNodeMesh: cfg.MeshEnabled(), Nodes: []nodeView{}}
	kvs, err := store.List(ctx, datastore.NodesPrefix)
	if err != nil {
		return bgpConfigView{}, err
	}
	for _, kv := range kvs {
		var n datastore.Node
		if json.Unmarshal(kv.Value, &n) != nil {
			continue
		}
		view.Nodes = append(view.Nodes, nodeView{Name: n.Name, IPv4: n.IPv4, ASN: routing.EffectiveASN(n, cfg), RouteReflector: n.RouteReflector, ClusterID: n.ClusterID})
	}
	return view, nil
}
