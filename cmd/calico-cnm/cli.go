package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

// problemsFound is returned by `ipam check` when it found something to fix.
type problemsFound struct{ n int }

func (p problemsFound) Error() string { return fmt.Sprintf("%d problem(s) found", p.n) }

// clientFlags are the datastore flags every operator command shares.
type clientFlags struct {
	endpoints string
	output    string
	timeout   time.Duration
	cfg       datastore.Config
}

func (c *cli) newFlagSet(name string) (*flag.FlagSet, *clientFlags) {
	base := plugin.DefaultConfig(c.getenv).Datastore
	cf := &clientFlags{cfg: base}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(&cf.endpoints, "etcd-endpoints", strings.Join(base.Endpoints, ","), "etcd URLs (env ETCD_ENDPOINTS; default: the local daemon's embedded member "+datastore.DefaultEmbeddedClientURL+")")
	fs.StringVar(&cf.output, "o", "table", "output format: table or json")
	fs.DurationVar(&cf.timeout, "timeout", 10*time.Second, "datastore timeout")
	return fs, cf
}

// parse handles flags that may come before or after positional arguments
// (`pool add 10.0.0.0/16 --block-size 28`), as users type them.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, parseErr(err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (cf *clientFlags) open(ctx context.Context) (*datastore.Store, error) {
	if cf.output != "table" && cf.output != "json" {
		return nil, usagef("-o %q: use table or json", cf.output)
	}
	cfg := cf.cfg
	cfg.Endpoints = plugin.SplitEndpoints(cf.endpoints)
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = []string{datastore.DefaultEmbeddedClientURL}
	}
	cfg.RequestTimeout = cf.timeout
	cfg.Embedded = false
	s, err := datastore.Open(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// log is the IPAM engine's logger for one CLI command: the command prints
// its own result on stdout, so only warnings (on the command's stderr, not
// the process's) are worth showing.
func (c *cli) log() *logrus.Logger {
	l := newLogger(c.stderr)
	l.SetLevel(logrus.WarnLevel)
	return l
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) table(header string, rows [][]string) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func (c *cli) pool(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("pool needs a subcommand: add, list, set, delete, disable or enable")
	}
	sub := args[0]
	fs, cf := c.newFlagSet("pool " + sub)
	blockSize := fs.Int("block-size", 0, "block prefix length (default 26 for IPv4, 122 for IPv6)")
	nat := fs.Bool("nat-outgoing", false, "masquerade traffic leaving the pools")
	disabled := fs.Bool("disabled", false, "create the pool disabled")
	vxlanMode := fs.String("vxlan-mode", "", "when to encapsulate in VXLAN: Never (default), Always or CrossSubnet")
	ipipMode := fs.String("ipip-mode", "", "Never (IP-in-IP is not supported)")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	needCIDR := func() (string, error) {
		if len(pos) != 1 {
			return "", usagef("pool %s needs exactly one CIDR, e.g. 'calico-cnm pool %s 10.10.0.0/16'", sub, sub)
		}
		if _, _, err := net.ParseCIDR(pos[0]); err != nil {
			return "", usagef("%q is not a CIDR (expected e.g. 10.10.0.0/16)", pos[0])
		}
		return pos[0], nil
	}
	switch sub {
	case "add", "delete", "disable", "enable", "set":
		if _, err := needCIDR(); err != nil {
			return err
		}
		if sub == "set" && *vxlanMode == "" {
			return usagef("pool set needs --vxlan-mode Never, Always or CrossSubnet")
		}
	case "list":
		if len(pos) != 0 {
			return usagef("pool list takes no arguments")
		}
	default:
		return usagef("unknown pool subcommand %q: use add, list, set, delete, disable or enable", sub)
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	eng := ipam.New(store, ipam.Options{Log: c.log()})
	switch sub {
	case "add":
		p, err := eng.AddPool(ctx, ipam.Pool{CIDR: pos[0], BlockSize: *blockSize, NATOutgoing: *nat, Disabled: *disabled, VXLANMode: *vxlanMode, IPIPMode: *ipipMode})
		if errors.Is(err, ipam.ErrInvalidCIDR) || errors.Is(err, ipam.ErrInvalidArgument) {
			// A block size out of range or host bits set: the command
			// line is wrong, not the datastore.
			return usageError{err.Error()}
		}
		if err != nil {
			return err
		}
		if cf.output == "json" {
			return c.printJSON(p)
		}
		if p.Encapsulates() {
			fmt.Fprintf(c.stdout, "pool %s added (block size /%d, vxlanMode %s)\n", p.CIDR, p.BlockSize, p.VXLAN())
			return nil
		}
		fmt.Fprintf(c.stdout, "pool %s added (block size /%d)\n", p.CIDR, p.BlockSize)
		return nil
	case "set":
		return c.poolSet(ctx, eng, cf, pos[0], *vxlanMode)
	case "delete":
		if err := eng.DeletePool(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "pool %s deleted\n", pos[0])
		return nil
	case "disable", "enable":
		if err := eng.SetPoolDisabled(ctx, pos[0], sub == "disable"); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "pool %s %sd\n", pos[0], sub)
		return nil
	}
	pools, err := eng.ListPools(ctx)
	if err != nil {
		return err
	}
	if cf.output == "json" {
		if pools == nil {
			pools = []ipam.Pool{}
		}
		return c.printJSON(pools)
	}
	var rows [][]string
	for _, p := range pools {
		rows = append(rows, []string{p.CIDR, "/" + strconv.Itoa(p.BlockSize), strconv.FormatBool(p.NATOutgoing), strconv.FormatBool(p.Disabled), p.VXLAN()})
	}
	return c.table("CIDR\tBLOCK SIZE\tNAT OUTGOING\tDISABLED\tVXLAN MODE", rows)
}

func (c *cli) ipam(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("ipam needs a subcommand: show, check or release")
	}
	sub := args[0]
	fs, cf := c.newFlagSet("ipam " + sub)
	release := fs.Bool("release", false, "with check: fix what was found (release leaked addresses, delete orphaned handles)")
	ipFlag := fs.String("ip", "", "with release: the address to release")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("ipam %s takes no positional arguments, got %q", sub, pos)
	}
	var ip net.IP
	switch sub {
	case "show", "check":
	case "release":
		if ip = net.ParseIP(*ipFlag); ip == nil {
			return usagef("ipam release needs --ip with a valid address, got %q", *ipFlag)
		}
	default:
		return usagef("unknown ipam subcommand %q: use show, check or release", sub)
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	eng := ipam.New(store, ipam.Options{Log: c.log()})
	switch sub {
	case "release":
		// ReleaseIP is idempotent (Docker retries releases); an operator
		// who names a free address has most likely mistyped it.
		allocs, err := eng.Allocations(ctx)
		if err != nil {
			return err
		}
		handle := ""
		for _, a := range allocs {
			if a.IP.Equal(ip) {
				handle = a.HandleID
			}
		}
		if handle == "" {
			if err := inSomePool(ctx, eng, ip); err != nil {
				return err
			}
			return fmt.Errorf("%s is not allocated: nothing to release", ip)
		}
		if err := eng.ReleaseIP(ctx, ip); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "released %s (handle %s)\n", ip, handle)
		return nil
	case "check":
		return c.ipamCheck(ctx, store, eng, cf, *release)
	}
	usage, err := eng.Usage(ctx)
	if err != nil {
		return err
	}
	if cf.output == "json" {
		if usage == nil {
			usage = []ipam.BlockUsage{}
		}
		return c.printJSON(usage)
	}
	sort.Slice(usage, func(i, j int) bool { return usage[i].CIDR < usage[j].CIDR })
	var rows [][]string
	for _, u := range usage {
		host := u.Host
		if host == "" {
			host = "-"
		}
		rows = append(rows, []string{u.CIDR, u.Pool, host, strconv.Itoa(u.Used), strconv.Itoa(u.Size - u.Used)})
	}
	return c.table("BLOCK\tPOOL\tHOST\tUSED\tFREE", rows)
}

// inSomePool explains an address outside every pool.
func inSomePool(ctx context.Context, eng *ipam.Engine, ip net.IP) error {
	pools, err := eng.ListPools(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, p := range pools {
		if _, n, err := net.ParseCIDR(p.CIDR); err == nil && n.Contains(ip) {
			return nil
		}
		names = append(names, p.CIDR)
	}
	return fmt.Errorf("%s is not in any IP pool (pools: %s), so calico-ipam never assigned it", ip, orDash(strings.Join(names, ", ")))
}

func (c *cli) ipamCheck(ctx context.Context, store *datastore.Store, eng *ipam.Engine, cf *clientFlags, fix bool) error {
	live, err := liveHandles(ctx, store, eng)
	if err != nil {
		return err
	}
	rep, err := eng.Check(ctx, func(h string) bool { return live[h] })
	if err != nil {
		return err
	}
	if cf.output == "json" {
		if err := c.printJSON(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "leaked addresses:     %d\n", len(rep.LeakedHandles))
		for _, h := range rep.LeakedHandles {
			fmt.Fprintf(c.stdout, "  %s\n", h)
		}
		fmt.Fprintf(c.stdout, "orphaned handles:     %d\n", len(rep.OrphanedHandles))
		for _, h := range rep.OrphanedHandles {
			fmt.Fprintf(c.stdout, "  %s\n", h)
		}
		fmt.Fprintf(c.stdout, "missing affinities:   %d\n", len(rep.MissingAffinities))
		fmt.Fprintf(c.stdout, "dangling affinities:  %d\n", len(rep.DanglingAffinities))
	}
	if rep.Problems() == 0 {
		return nil
	}
	if fix {
		if err := eng.Fix(ctx, rep); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "fixed %d problem(s)\n", rep.Problems())
		return nil
	}
	return problemsFound{rep.Problems()}
}

// liveHandles is the set of IPAM handles whose address belongs to an
// endpoint the datastore still records, on any node. Handles are opaque
// (Docker's RequestAddress happens before the endpoint exists), so the match
// is by address.
func liveHandles(ctx context.Context, store *datastore.Store, eng *ipam.Engine) (map[string]bool, error) {
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, err
	}
	inUse := map[string]bool{}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if err := json.Unmarshal(kv.Value, &ep); err != nil {
			continue
		}
		for _, cidr := range []string{ep.IPv4, ep.IPv6} {
			if ip, _, err := net.ParseCIDR(cidr); err == nil {
				inUse[ip.String()] = true
			}
		}
	}
	allocs, err := eng.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, a := range allocs {
		// The swarm manager's assignments (service VIPs, tasks not
		// started yet) have no endpoint record: the manager releases them.
		if inUse[a.IP.String()] || a.Attrs[driver.AttrSwarm] == "true" {
			live[a.HandleID] = true
		}
		// A VTEP address lives as long as its node's record.
		if node, ok := ipam.TunnelHandleNode(a.HandleID); ok {
			if _, err := store.Get(ctx, datastore.NodeKey(node)); err == nil {
				live[a.HandleID] = true
			}
		}
	}
	return live, nil
}

func (c *cli) network(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		return usagef("network needs the subcommand list")
	}
	fs, cf := c.newFlagSet("network list")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("network list takes no arguments")
	}
	store, err := cf.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	nets, err := store.List(ctx, datastore.NetworksPrefix)
	if err != nil {
		return err
	}
	eps, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return err
	}
	count := map[string]int{}
	for _, kv := range eps {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) == nil {
			count[ep.Network]++
		}
	}
	type row struct {
		datastore.Network
		Endpoints int `json:"endpoints"`
	}
	out := []row{}
	for _, kv := range nets {
		var n datastore.Network
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			continue
		}
		out = append(out, row{n, count[n.ID]})
	}
	if cf.output == "json" {
		return c.printJSON(out)
	}
	var rows [][]string
	for _, r := range out {
		id := r.ID
		if len(id) > 12 {
			id = id[:12]
		}
		rows = append(rows, []string{id, orDash(r.Name), orDash(strings.Join(r.Subnets, ",")), orDash(strings.Join(r.Pools, ",")), strconv.Itoa(r.Endpoints)})
	}
	return c.table("NETWORK ID\tNAME\tSUBNETS\tPOOLS\tENDPOINTS", rows)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
