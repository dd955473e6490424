package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fakeHost answers the programs diags runs from a table; files are real
// (a test's temp dir).
type fakeHost struct {
	realHost
	outputs map[string]string // "name arg1 arg2" -> output
	missing map[string]bool   // programs that are not installed
}

func (h fakeHost) Command(_ context.Context, name string, args ...string) ([]byte, error) {
	if h.missing[name] {
		return nil, fmt.Errorf("%s: %w", name, exec.ErrNotFound)
	}
	if out, ok := h.outputs[strings.Join(append([]string{name}, args...), " ")]; ok {
		return []byte(out), nil
	}
	return []byte("no such thing\n"), errors.New("exit status 1")
}

func (fakeHost) Hostname() (string, error) { return "fakehost", nil }

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// readTarball returns the files of a .tar.gz by name (without the top
// directory), and the top directories seen.
func readTarball(t *testing.T, path string) (map[string]string, map[string]bool) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("tarball mode %04o, want 0600", st.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files, tops := map[string]string{}, map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, tops
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		top, name, _ := strings.Cut(h.Name, "/")
		tops[top] = true
		files[name] = string(b)
	}
}

// runDiags runs `calico-cnm diags` with host and returns the tarball's
// files.
func runDiags(t *testing.T, env map[string]string, host hostAccess, args ...string) (result, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	root := newRootCmd(&app{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }, host: host})
	root.SetArgs(append([]string{"diags", "--dir", dir}, args...))
	cmd, err := root.ExecuteContextC(context.Background())
	r := result{code: exitCode(err, cmd, &errOut), stdout: out.String(), stderr: errOut.String()}
	if r.code != exitOK {
		t.Fatalf("diags: %s", r)
	}
	m := regexp.MustCompile(`^diagnostics written to (\S+) \(\d+ files, \d+ notes\)\n$`).FindStringSubmatch(r.stdout)
	if m == nil || filepath.Dir(m[1]) != dir {
		t.Fatalf("diags output: %s", r)
	}
	files, tops := readTarball(t, m[1])
	if len(tops) != 1 || !tops[strings.TrimSuffix(filepath.Base(m[1]), ".tar.gz")] {
		t.Errorf("tarball top directories %v, want the tarball's name only", tops)
	}
	return r, files
}

var diagsListing = []string{
	"version.txt", "config.txt", "systemd-env.txt", "node-status.txt",
	"pool-list.txt", "ipam-show.txt", "ipam-check.txt", "ipam-configure.txt", "network-list.txt",
	"node-list.txt", "bgp-config.txt", "bgp-peer-list.txt", "endpoints.json",
	"ip-route.txt", "ip-6-route.txt", "ip-rule.txt", "ip-link.txt", "ip-addr.txt", "ip-neigh.txt", "ip-6-neigh.txt",
	"sysctl.txt", "nft-ip-calico-cnm.txt", "nft-ip6-calico-cnm.txt",
	"nft-ip-filter-DOCKER-USER.txt", "nft-ip6-filter-DOCKER-USER.txt",
	"log-systemd.txt", "notes.txt",
}

func checkListing(t *testing.T, files map[string]string, extra ...string) {
	t.Helper()
	want := append(append([]string(nil), diagsListing...), extra...)
	var got []string
	for name := range files {
		got = append(got, name)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("tarball listing:\n%s\nwant:\n%s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

func noSecrets(t *testing.T, files map[string]string, secrets ...string) {
	t.Helper()
	for name, content := range files {
		for _, s := range secrets {
			if strings.Contains(content, s) {
				t.Errorf("%s contains the secret %q:\n%s", name, s, content)
			}
		}
	}
}

// TestDiags: the tarball has every section, the datastore's listings and
// the host's state, notes for what is missing, and no secret: not a BGP
// peer's password, not a password in an env file, a URL or a plugin's
// settings, not a TLS key's content.
func TestDiags(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	ctx := context.Background()
	if _, err := ipam.New(store, ipam.Options{Log: quietLog()}).AddPool(ctx, ipam.Pool{CIDR: "10.77.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	peer := datastore.BGPPeer{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, Password: "Peer-PW-1"}
	if err := store.Txn(ctx, datastore.Create(datastore.BGPPeerKey("tor"), datastore.MustJSON(peer))); err != nil {
		t.Fatal(err)
	}
	if err := store.Txn(ctx, datastore.Create(datastore.EndpointKey("h1", "e1"), datastore.MustJSON(datastore.Endpoint{ID: "e1", Node: "h1", IPv4: "10.77.0.5/32"}))); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	keyFile := filepath.Join(tmp, "key.pem")
	writeFiles(t, tmp, map[string]string{
		"key.pem": "-----BEGIN PRIVATE KEY-----\nKey-Content-4\n",
		"calico-cnm.env": "ETCD_ENDPOINTS=http://root:Url-PW-3@10.0.0.10:2379\nBGP_PASSWORD=Env-PW-2\n" +
			"ETCD_KEY_FILE=" + keyFile + "\nNODENAME=h1\n",
		"proc/net/ipv4/ip_forward":                      "1\n",
		"proc/net/ipv6/conf/all/forwarding":             "1\n",
		"proc/net/ipv4/conf/cali0123456789a/proxy_arp":  "1\n",
		"proc/net/ipv4/conf/cali0123456789a/forwarding": "1\n",
		"proc/net/ipv4/conf/eth0/proxy_arp":             "0\n",
	})
	host := fakeHost{
		missing: map[string]bool{"nft": true},
		outputs: map[string]string{
			"ip route show table all":    "blackhole 10.77.0.0/26 proto 80\n",
			"ip -6 route show table all": "fe80::/64 dev eth0\n",
			"ip rule":                    "0: from all lookup local\n",
			"ip -d link show":            "7: cali0123456789a@if2: <BROADCAST,UP>\n",
			"ip addr show":               "1: lo\n",
			"ip neigh show":              "10.77.0.5 dev cali0123456789a lladdr ee:ee:ee:ee:ee:ee PERMANENT\n",
			"ip -6 neigh show":           "",
			"docker plugin ls --no-trunc --format {{.ID}} {{.Name}}": "abc123 calico:latest\nfff999 other:latest\n",
			"docker plugin inspect abc123":                           `[{"Settings":{"Env":["ETCD_ENDPOINTS=http://u:Plugin-PW-5@10.0.0.1:2379","SECRET_TOKEN=Plugin-PW-6","LOG_LEVEL=debug"]}}]`,
			"systemctl show -p LoadState --value calico-cnm":         "loaded\n",
			"journalctl -u calico-cnm -n 500 --no-pager":             "Dec 03 calico-cnm[42]: level=info msg=\"serving\"\n",
			"journalctl -u docker -n 25000 --no-pager":               "dockerd: level=info msg=\"x\" plugin=abc123\ndockerd: level=info msg=\"y\" plugin=fff999\n",
		},
	}
	env := map[string]string{"ETCD_ENDPOINTS": ep, "NODENAME": "h1", "AS": "65001", "BGP_PASSWORD": "Env-PW-7"}
	_, files := runDiags(t, env, host, "--env-file", filepath.Join(tmp, "calico-cnm.env"), "--proc-sys", filepath.Join(tmp, "proc"), "--state-dir", tmp)
	checkListing(t, files, "plugin-calico_latest.json", "log-plugin-calico_latest.txt")
	noSecrets(t, files, "Peer-PW-1", "Env-PW-2", "Url-PW-3", "Key-Content-4", "Plugin-PW-5", "Plugin-PW-6", "Env-PW-7")
	for name, wants := range map[string][]string{
		"version.txt":                  {"calico-cnm " + Version},
		"config.txt":                   {"--etcd-endpoints=" + ep, "NODENAME=h1", "AS=65001"},
		"systemd-env.txt":              {"BGP_PASSWORD=***", "ETCD_ENDPOINTS=http://root:***@10.0.0.10:2379", "ETCD_KEY_FILE=" + keyFile},
		"plugin-calico_latest.json":    {"SECRET_TOKEN=***", "http://u:***@10.0.0.1", "LOG_LEVEL=debug"},
		"pool-list.txt":                {"10.77.0.0/16", "BLOCKS"},
		"ipam-configure.txt":           {"strictAffinity:      false"},
		"bgp-peer-list.txt":            {"tor", "10.0.0.254", "yes"},
		"endpoints.json":               {`"ipv4": "10.77.0.5/32"`},
		"node-status.txt":              {"no status from the daemon", "exit 1"},
		"ip-route.txt":                 {"blackhole 10.77.0.0/26"},
		"ip-neigh.txt":                 {"cali0123456789a"},
		"sysctl.txt":                   {"net.ipv4.ip_forward = 1", "net.ipv4.conf.cali0123456789a.proxy_arp = 1", "net.ipv4.conf.cali0123456789a.rp_filter = (unreadable"},
		"nft-ip-calico-cnm.txt":        {"not collected: nft is not installed"},
		"log-systemd.txt":              {`msg="serving"`},
		"log-plugin-calico_latest.txt": {"plugin=abc123"},
		"notes.txt":                    {"nft-ip6-calico-cnm.txt: nft is not installed on this host"},
	} {
		for _, w := range wants {
			if !strings.Contains(files[name], w) {
				t.Errorf("%s lacks %q:\n%s", name, w, files[name])
			}
		}
	}
	for name, unwanted := range map[string]string{
		"sysctl.txt":                   "eth0",
		"log-plugin-calico_latest.txt": "fff999",
	} {
		if strings.Contains(files[name], unwanted) {
			t.Errorf("%s has %q:\n%s", name, unwanted, files[name])
		}
	}
}

// TestDiagsNothingAnswers: with TLS files configured, an etcd that does not
// answer, and no tool installed, diags still writes the whole tarball, with
// notes, and never the key's content.
func TestDiagsNothingAnswers(t *testing.T) {
	tmp := t.TempDir()
	writeFiles(t, tmp, map[string]string{"key.pem": "Key-Content-8\n", "cert.pem": "Cert-Content-9\n"})
	env := map[string]string{
		"ETCD_ENDPOINTS": fmt.Sprintf("https://127.0.0.1:%d", etcdtest.DeadPort(t)),
		"ETCD_KEY_FILE":  filepath.Join(tmp, "key.pem"),
		"ETCD_CERT_FILE": filepath.Join(tmp, "cert.pem"),
	}
	missing := map[string]bool{}
	for _, p := range []string{"ip", "nft", "docker", "systemctl", "journalctl"} {
		missing[p] = true
	}
	_, files := runDiags(t, env, fakeHost{missing: missing}, "--timeout", "1s", "--env-file", filepath.Join(tmp, "none.env"), "--proc-sys", filepath.Join(tmp, "proc"), "--state-dir", tmp)
	checkListing(t, files)
	noSecrets(t, files, "Key-Content-8", "Cert-Content-9")
	for name, want := range map[string]string{
		"pool-list.txt":   "not collected: the datastore did not answer",
		"ip-route.txt":    "not collected: ip is not installed",
		"log-systemd.txt": "not collected: systemctl",
		"config.txt":      "--etcd-key-file=" + filepath.Join(tmp, "key.pem"),
		"notes.txt":       "endpoints.json: the datastore did not answer",
	} {
		if !strings.Contains(files[name], want) {
			t.Errorf("%s lacks %q:\n%s", name, want, files[name])
		}
	}
}
