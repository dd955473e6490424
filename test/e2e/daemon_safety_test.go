package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// logrusLine is one line of the daemon's log format (logrus text).
var logrusLine = regexp.MustCompile(`^time="[^"]+" level=(\w+) msg=`)

// TestCleanStopLogsNoErrors: the daemon with its embedded etcd member,
// stopped by SIGTERM, logs nothing at error level and writes one format
// only (logrus), etcd's own messages included (issue 12 item 9).
func TestCleanStopLogsNoErrors(t *testing.T) {
	t.Parallel()
	bin := harness.BuildBinary(t)
	h := harness.NewHost(t, "cleanstop", harness.HostOptions{NoDockerd: true})
	p := h.StartPlugin(t, bin, nil) // --log-level debug: etcd's info lines too
	stopCleanly(t, p)
	etcdLines := 0
	for _, line := range strings.Split(strings.TrimSpace(p.Log()), "\n") {
		if strings.HasPrefix(line, "=== harness:") {
			continue
		}
		m := logrusLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("log line in a second format: %q", line)
			continue
		}
		switch m[1] {
		case "error", "fatal", "panic":
			t.Errorf("%s-level line on a clean stop: %q", m[1], line)
		}
		if strings.Contains(line, " component=etcd") {
			etcdLines++
		}
	}
	if etcdLines == 0 {
		t.Errorf("no etcd log line went through logrus (component=etcd) at --log-level debug")
	}
}

// TestEmbeddedEtcdRootOnly: by default the embedded etcd member serves
// clients on a unix socket in the state dir that only root may open, and
// nothing on TCP; root's CLI finds it with no flags; an unprivileged local
// user reaches it neither way; a non-loopback TCP listener is refused
// (issue 12 item 8).
func TestEmbeddedEtcdRootOnly(t *testing.T) {
	t.Parallel()
	harness.RequireFile(t, "/usr/bin/setpriv", "package util-linux")
	harness.RequireFile(t, "/usr/bin/etcdctl", "package etcd-client")
	bin := harness.BuildBinary(t)
	h := harness.NewHost(t, "rootonly", harness.HostOptions{NoDockerd: true})
	// Only the socket's own mode may keep other users out: open the
	// directories on the way (the harness makes them 0700).
	for _, d := range []string{h.Dir, h.StateDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.StartPlugin(t, bin, nil, "serve", "--socket-dir", h.PluginDir, "--state-dir", h.StateDir,
		"--nodename", h.Name, "--log-level", "debug")

	sock := filepath.Join(h.StateDir, "etcd.sock")
	for _, s := range []string{sock, filepath.Join(h.StateDir, "etcd-peer.sock")} {
		st, err := os.Stat(s)
		if err != nil {
			t.Fatalf("embedded etcd socket: %v", err)
		}
		if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a socket with mode 0600", s, st.Mode())
		}
	}
	// Root's CLI, no flags: the state dir comes from the environment, as
	// for the daemon.
	out, err := h.Exec(t, "env", "CALICO_CNM_STATE_DIR="+h.StateDir, bin, "pool", "add", "10.77.0.0/16")
	if err != nil {
		t.Fatalf("root's CLI without flags: %v\n%s", err, out)
	}
	if out, err := h.Exec(t, "env", "CALICO_CNM_STATE_DIR="+h.StateDir, bin, "pool", "list"); err != nil || !strings.Contains(out, "10.77.0.0/16") {
		t.Fatalf("root's CLI without flags: pool list: %v\n%s", err, out)
	}
	// The same read as root works, so a failure as nobody is the
	// permission, not the command.
	get := []string{"etcdctl", "--dial-timeout", "2s", "--command-timeout", "3s", "get", "--prefix", "--keys-only", "/calico-cnm/"}
	if out, err := h.Exec(t, append([]string{"etcdctl", "--endpoints", "unix://" + sock}, get[1:]...)...); err != nil || !strings.Contains(out, "pools") {
		t.Fatalf("root's etcdctl on %s: %v\n%s", sock, err, out)
	}
	nobody := []string{"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"}
	for _, ep := range []string{"unix://" + sock, "http://127.0.0.1:2379", "http://127.0.0.1:2380"} {
		argv := append(append(append([]string(nil), nobody...), "etcdctl", "--endpoints", ep), get[1:]...)
		if out, err := h.Exec(t, argv...); err == nil {
			t.Errorf("user nobody read the datastore at %s:\n%s", ep, out)
		}
	}

	// A listener other hosts could reach is refused before anything starts.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := filepath.Join(h.Dir, "bad-state")
	out, err = h.ExecCtx(ctx, bin, "serve", "--socket-dir", filepath.Join(h.Dir, "bad-plugins"), "--state-dir", bad,
		"--nodename", "bad", "--etcd-listen-client", "http://0.0.0.0:23799", "--etcd-listen-peer", "http://127.0.0.1:23800")
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "--etcd-listen-client http://0.0.0.0:23799") {
		t.Errorf("serve --etcd-listen-client http://0.0.0.0:23799: want a quick refusal naming the flag, got %v\n%s", err, out)
	}
}

// TestDuplicateNodeNameRefused: two hosts (two dockerds, one etcd) with one
// NODENAME, as cloned VMs get. The second daemon does not serve: it logs an
// error naming the first (pid and Docker engine ID) and waits; once the
// first stops it takes the name and serves, and its endpoint records carry
// its engine ID (issue 12 item 2).
func TestDuplicateNodeNameRefused(t *testing.T) {
	t.Parallel()
	bin := harness.BuildBinary(t)
	fab := harness.NewFabric(t, "")
	etcd := fab.StartEtcd(t)
	a := fab.AddHost(t, "twin-a", harness.HostOptions{})
	b := fab.AddHost(t, "twin-b", harness.HostOptions{})
	env := []string{"ETCD_ENDPOINTS=" + etcd}
	pa := a.StartPlugin(t, bin, env, append(a.ServeArgs(env), "--nodename", "twin")...)
	engineA := strings.TrimSpace(a.MustDocker(t, "info", "-f", "{{.ID}}"))
	engineB := strings.TrimSpace(b.MustDocker(t, "info", "-f", "{{.ID}}"))
	// The harness's dockerds share /etc/docker/key.json, hence their engine
	// ID, as clones of one VM image would: the refusal must not rely on it.
	if engineA == "" || engineB == "" {
		t.Fatalf("engine IDs %q and %q", engineA, engineB)
	}

	pb := b.StartProcess(t, "plugin-twin", env, nil, append([]string{bin}, append(b.ServeArgs(env), "--nodename", "twin")...)...)
	refusal := `node name \"twin\" is held by another live daemon: pid ` + fmt.Sprint(pa.Pid())
	harness.Eventually(t, 30*time.Second, time.Second, "the second daemon refuses, naming the first", func() error {
		log := pb.Log()
		if !strings.Contains(log, refusal) || !strings.Contains(log, "(Docker engine "+engineA+")") {
			return fmt.Errorf("no refusal naming pid %d and engine %s in its log:\n%s", pa.Pid(), engineA, pb.LogTail(10))
		}
		return nil
	})
	// It logged the refusal before serving anything: no socket answers.
	for _, s := range []string{harness.NetworkSocket, harness.IpamSocket} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := harness.PluginActivate(ctx, filepath.Join(b.PluginDir, s))
		cancel()
		if err == nil {
			t.Errorf("the refused daemon serves %s", s)
		}
	}
	if !pb.Running() {
		t.Fatalf("the refused daemon exited: %v", pb.ExitErr())
	}

	// The first stops (cleanly: its lease goes at once); the second serves.
	if err := pa.Stop(t); err != nil {
		t.Fatalf("stopping the first daemon: %v", err)
	}
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "the second daemon serves once the name is free", func() error {
		for _, s := range []string{harness.NetworkSocket, harness.IpamSocket} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := harness.PluginActivate(ctx, filepath.Join(b.PluginDir, s))
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	})

	// Its endpoint records name its engine.
	b.ImportBusybox(t)
	b.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "net1")
	b.MustDocker(t, "run", "-d", "--name", "c1", "--net", "net1", harness.Image, "sleep", "3600")
	out, err := b.Exec(t, "etcdctl", "--endpoints", etcd, "get", "--prefix", "--print-value-only", "/calico-cnm/v1/endpoints/twin/")
	if err != nil || !strings.Contains(out, `"engineID":"`+engineB+`"`) {
		t.Errorf("endpoint record of c1 on twin-b: want engineID %s, got %v\n%s", engineB, err, out)
	}
}
