package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

// Where the host-service install keeps its environment (contrib/systemd).
const (
	systemdUnit    = "calico-cnm"
	systemdEnvFile = "/etc/calico-cnm/calico-cnm.env"
)

// diagsFile is one file of the tarball.
type diagsFile struct {
	name string
	data []byte
}

// diags gathers the files of one bug report.
type diags struct {
	a        *app
	root     *cobra.Command // the invocation's tree: its global flags
	host     hostAccess
	stateDir string
	procSys  string
	envFile  string
	logLines int
	plugins  []managedPlugin
	files    []diagsFile
	notes    []string
}

func (a *app) diagsCmd() *cobra.Command {
	d := &diags{a: a}
	var dir string
	c := &cobra.Command{
		Use:   "diags [--dir D]",
		Short: "Collect what a bug report needs from this host into one tarball",
		Long: `diags writes calico-cnm-diags-<node>-<time>.tar.gz: the version, the effective
configuration (secrets masked), node status, pools, ipam show and check,
networks, endpoints, nodes, BGP settings and peers (never passwords), routes,
links, neighbours and sysctls of the cali interfaces, this project's
nftables tables, and the last lines of the daemon's log when it runs as the
systemd unit or as a managed plugin. What cannot be collected (a missing
tool, an unreachable datastore) is noted in the tarball.`,
		Example: `  calico-cnm diags
  calico-cnm diags --dir /root --log-lines 2000 --etcd-endpoints http://10.0.0.10:2379`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			d.root = c.Root()
			d.host = a.host
			if d.host == nil {
				d.host = realHost{}
			}
			path, err := d.write(c.Context(), dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "diagnostics written to %s (%d files, %d notes)\n", path, len(d.files), len(d.notes))
			return nil
		},
	}
	cfg := plugin.DefaultConfig(a.getenv)
	c.Flags().StringVar(&dir, "dir", os.TempDir(), "directory to write the tarball to")
	c.Flags().IntVar(&d.logLines, "log-lines", 500, "how many of the daemon's last log lines to include")
	c.Flags().StringVar(&d.stateDir, "state-dir", cfg.StateDir, "the daemon's state dir, where its status socket is (env "+plugin.EnvStateDir+")")
	c.Flags().StringVar(&d.procSys, "proc-sys", orDefaultStr(cfg.ProcSys, "/proc/sys"), "where to read sysctls (env "+plugin.EnvProcSys+")")
	c.Flags().StringVar(&d.envFile, "env-file", systemdEnvFile, "the systemd unit's environment file")
	return c
}

func orDefaultStr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// write collects everything and writes the tarball into dir.
func (d *diags) write(ctx context.Context, dir string) (string, error) {
	node := d.a.getenv(plugin.EnvNodeName)
	if node == "" {
		node, _ = d.host.Hostname()
	}
	name := fmt.Sprintf("calico-cnm-diags-%s-%s", strings.ReplaceAll(orDefaultStr(node, "node"), "/", "_"), time.Now().UTC().Format("20060102-150405"))
	d.add("version.txt", []byte("calico-cnm "+Version+"\n"))
	d.collectConfig(ctx)
	d.collectDatastore(ctx)
	d.collectNetwork(ctx)
	d.collectLogs(ctx)
	d.add("notes.txt", []byte(strings.Join(append(d.notes, ""), "\n")))
	var buf bytes.Buffer
	if err := d.tarball(&buf, name); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".tar.gz")
	// 0600: routes, addresses and logs describe the network.
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		return "", fmt.Errorf("writing the tarball: %w", err)
	}
	return path, nil
}

// add stores a file, masked.
func (d *diags) add(name string, data []byte) {
	d.files = append(d.files, diagsFile{name: name, data: maskText(data)})
}

// note records what could not be collected, in notes.txt and the file.
func (d *diags) note(file, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	d.notes = append(d.notes, file+": "+msg)
	d.add(file, []byte("# not collected: "+msg+"\n"))
}

func (d *diags) tarball(w *bytes.Buffer, dir string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	for _, f := range d.files {
		hdr := &tar.Header{Name: dir + "/" + f.name, Mode: 0o600, Size: int64(len(f.data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// collectConfig: the global flags as this invocation resolved them, the
// daemon's environment variables, the systemd env file and the managed
// plugins' settings, secrets masked.
func (d *diags) collectConfig(ctx context.Context) {
	var b strings.Builder
	b.WriteString("# global flags (flag or environment)\n")
	d.root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		fmt.Fprintf(&b, "--%s=%s\n", f.Name, maskValue(f.Name, f.Value.String()))
	})
	b.WriteString("\n# environment of this command\n")
	for _, name := range daemonEnv {
		if v := d.a.getenv(name); v != "" {
			fmt.Fprintf(&b, "%s=%s\n", name, maskValue(name, v))
		}
	}
	d.add("config.txt", []byte(b.String()))
	if env, err := d.host.ReadFile(d.envFile); err == nil {
		d.add("systemd-env.txt", env)
	} else {
		d.note("systemd-env.txt", "%s: %v", d.envFile, err)
	}
	d.plugins = d.managedPlugins(ctx)
	for _, p := range d.plugins {
		d.command(ctx, "plugin-"+p.name+".json", "docker", "plugin", "inspect", p.id)
	}
}

// daemonEnv are the environment variables `serve` reads.
var daemonEnv = []string{
	plugin.EnvEtcdEndpoints, plugin.EnvEtcdCA, plugin.EnvEtcdCert, plugin.EnvEtcdKey, plugin.EnvEtcdPrefix,
	plugin.EnvNodeName, plugin.EnvLogLevel, plugin.EnvStateDir, plugin.EnvSocketDir, plugin.EnvMetricsListen,
	plugin.EnvDockerHost, plugin.EnvProcSys,
	envBGP, envNodeIP, envNodeIPv6, envAutodetect, envASN, envBGPListen, envBGPPort, envRestartTime, envSecretsDir,
}

// diagsCLI are the operator commands whose output goes in the tarball, as
// a user would see them.
var diagsCLI = []struct {
	file string
	args []string
}{
	{"pool-list.txt", []string{"pool", "list", "-o", "wide"}},
	{"ipam-show.txt", []string{"ipam", "show", "-o", "wide"}},
	{"ipam-check.txt", []string{"ipam", "check"}},
	{"ipam-configure.txt", []string{"ipam", "configure"}},
	{"network-list.txt", []string{"network", "list", "-o", "wide"}},
	{"node-list.txt", []string{"node", "list", "-o", "wide"}},
	{"bgp-config.txt", []string{"bgp", "config"}},
	{"bgp-peer-list.txt", []string{"bgp", "peer", "list"}},
}

// collectDatastore runs the listing commands in process, with this
// invocation's global flags, once the datastore answered.
func (d *diags) collectDatastore(ctx context.Context) {
	d.add("node-status.txt", d.runCLI(ctx, "node", "status", "--state-dir", d.stateDir))
	err := d.a.withStore(ctx, func(store *datastore.Store, _ *ipam.Engine) error {
		return d.addEndpoints(ctx, store)
	})
	if err != nil {
		for _, c := range diagsCLI {
			d.note(c.file, "the datastore did not answer: %v", err)
		}
		d.note("endpoints.json", "the datastore did not answer: %v", err)
		return
	}
	for _, c := range diagsCLI {
		d.add(c.file, d.runCLI(ctx, c.args...))
	}
}

func (d *diags) addEndpoints(ctx context.Context, store *datastore.Store) error {
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return err
	}
	eps := []datastore.Endpoint{}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) == nil {
			eps = append(eps, ep)
		}
	}
	b, _ := json.MarshalIndent(eps, "", "  ")
	d.add("endpoints.json", append(b, '\n'))
	return nil
}

// runCLI runs one calico-cnm command in process and returns what it
// printed, with its exit code when it failed.
func (d *diags) runCLI(ctx context.Context, args ...string) []byte {
	var out, errOut bytes.Buffer
	d.root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	root := newRootCmd(&app{stdout: &out, stderr: &errOut, getenv: d.a.getenv, host: d.a.host})
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if code := exitCode(err, cmd, &errOut); code != exitOK {
		fmt.Fprintf(&out, "\n# calico-cnm %s: exit %d\n%s", strings.Join(args, " "), code, errOut.String())
	}
	return out.Bytes()
}
