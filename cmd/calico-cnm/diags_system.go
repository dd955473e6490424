package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/policy"
)

// command stores a program's output, or a note why there is none.
func (d *diags) command(ctx context.Context, file, name string, args ...string) {
	out, err := d.host.Command(ctx, name, args...)
	switch {
	case notInstalled(err):
		d.note(file, "%s is not installed on this host", name)
	case err != nil:
		cmd := strings.Join(append([]string{name}, args...), " ")
		d.notes = append(d.notes, fmt.Sprintf("%s: %s: %v", file, cmd, err))
		d.add(file, []byte(fmt.Sprintf("# %s failed: %v\n%s", cmd, err, out)))
	default:
		d.add(file, out)
	}
}

// collectNetwork: routes, links, addresses, neighbours, the cali
// interfaces' sysctls and the project's nftables tables.
func (d *diags) collectNetwork(ctx context.Context) {
	d.command(ctx, "ip-route.txt", "ip", "route", "show", "table", "all")
	d.command(ctx, "ip-6-route.txt", "ip", "-6", "route", "show", "table", "all")
	d.command(ctx, "ip-rule.txt", "ip", "rule")
	d.command(ctx, "ip-link.txt", "ip", "-d", "link", "show")
	d.command(ctx, "ip-addr.txt", "ip", "addr", "show")
	d.command(ctx, "ip-neigh.txt", "ip", "neigh", "show")
	d.command(ctx, "ip-6-neigh.txt", "ip", "-6", "neigh", "show")
	d.add("sysctl.txt", d.sysctls())
	for _, family := range []string{"ip", "ip6"} {
		d.command(ctx, "nft-"+family+"-"+policy.TableName+".txt", "nft", "list", "table", family, policy.TableName)
		// The forwarding accepts live in Docker's chain (dataplane/forward.go).
		d.command(ctx, "nft-"+family+"-filter-DOCKER-USER.txt", "nft", "list", "chain", family, "filter", "DOCKER-USER")
	}
}

// sysctls reads the forwarding and proxy settings of the host and of every
// cali interface.
func (d *diags) sysctls() []byte {
	var b bytes.Buffer
	read := func(rel string) {
		v, err := d.host.ReadFile(filepath.Join(d.procSys, rel))
		val := strings.TrimSpace(string(v))
		if err != nil {
			val = "(unreadable: " + err.Error() + ")"
		}
		fmt.Fprintf(&b, "%s = %s\n", strings.ReplaceAll(rel, "/", "."), val)
	}
	read("net/ipv4/ip_forward")
	read("net/ipv6/conf/all/forwarding")
	for _, fam := range []struct{ dir, keys string }{
		{"net/ipv4/conf", "forwarding proxy_arp rp_filter route_localnet"},
		{"net/ipv6/conf", "forwarding proxy_ndp disable_ipv6 accept_ra"},
	} {
		ifaces, _ := d.host.Glob(filepath.Join(d.procSys, fam.dir, dataplane.HostIfPrefix+"*"))
		for _, dir := range ifaces {
			for _, k := range strings.Fields(fam.keys) {
				read(filepath.Join(fam.dir, filepath.Base(dir), k))
			}
		}
		if len(ifaces) == 0 {
			fmt.Fprintf(&b, "# no %s* interface under %s\n", dataplane.HostIfPrefix, filepath.Join(d.procSys, fam.dir))
		}
	}
	return b.Bytes()
}

// managedPlugin is a Docker managed plugin that runs calico-cnm.
type managedPlugin struct{ id, name string }

// managedPlugins lists the enabled or disabled plugins named like ours.
func (d *diags) managedPlugins(ctx context.Context) []managedPlugin {
	out, err := d.host.Command(ctx, "docker", "plugin", "ls", "--no-trunc", "--format", "{{.ID}} {{.Name}}")
	if err != nil {
		d.notes = append(d.notes, fmt.Sprintf("managed plugins: docker plugin ls: %v", err))
		return nil
	}
	var ps []managedPlugin
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		id, name, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if ok && strings.Contains(name, "calico") {
			ps = append(ps, managedPlugin{id: id, name: strings.NewReplacer("/", "_", ":", "_").Replace(name)})
		}
	}
	return ps
}

// collectLogs: the last lines of the daemon's log, from journald, for the
// systemd unit and for each managed plugin (dockerd logs its plugins'
// output with plugin=<id>).
func (d *diags) collectLogs(ctx context.Context) {
	lines := fmt.Sprint(d.logLines)
	if out, err := d.host.Command(ctx, "systemctl", "show", "-p", "LoadState", "--value", systemdUnit); err != nil {
		d.note("log-systemd.txt", "systemctl: %v: %s", err, strings.TrimSpace(string(out)))
	} else if strings.TrimSpace(string(out)) != "loaded" {
		d.note("log-systemd.txt", "no %s systemd unit on this host (LoadState %s)", systemdUnit, strings.TrimSpace(string(out)))
	} else {
		d.command(ctx, "log-systemd.txt", "journalctl", "-u", systemdUnit, "-n", lines, "--no-pager")
	}
	plugins := d.plugins
	if len(plugins) == 0 {
		return
	}
	// A plugin's lines are a small part of dockerd's log: read more of it.
	out, err := d.host.Command(ctx, "journalctl", "-u", "docker", "-n", fmt.Sprint(50*d.logLines), "--no-pager")
	for _, p := range plugins {
		file := "log-plugin-" + p.name + ".txt"
		if err != nil {
			d.note(file, "journalctl -u docker: %v", err)
			continue
		}
		var mine []string
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "plugin="+p.id) {
				mine = append(mine, sc.Text())
			}
		}
		if len(mine) > d.logLines {
			mine = mine[len(mine)-d.logLines:]
		}
		d.add(file, []byte(strings.Join(append(mine, ""), "\n")))
	}
}
