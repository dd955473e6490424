package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestPluginInstallFromRegistry is the path of a user who has only a
// registry reference: the plugin built as `make plugin` does, pushed to a
// registry (Debian's docker-registry on a netns host of the fabric),
// removed, then `docker plugin install`ed from the registry, configured,
// enabled and used by two containers that ping each other.
func TestPluginInstallFromRegistry(t *testing.T) {
	t.Parallel()
	harness.RequirePrereqs(t)
	harness.RequireFile(t, "/usr/bin/docker-registry", "docker-registry (Debian package docker-registry)")
	f := harness.NewFabric(t, "")
	reg := f.AddHost(t, "registry", harness.HostOptions{NoDockerd: true})
	regAddr := reg.IP.String() + ":5000"
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	conf := fmt.Sprintf("version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), regAddr)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	reg.StartProcess(t, "docker-registry", nil, harness.TCPReady(regAddr), "/usr/bin/docker-registry", "serve", cfg)

	h := f.AddHost(t, "regclient", harness.HostOptions{DockerdArgs: []string{"--insecure-registry", regAddr}})
	h.ImportBusybox(t)
	ref := regAddr + "/calico"
	mp := createManagedPlugin(t, h, ref)
	mp.MustDocker(t, "plugin", "push", mp.driver)
	mp.MustDocker(t, "plugin", "rm", mp.driver)
	if out, err := mp.Docker(t, "plugin", "inspect", mp.driver); err == nil {
		t.Fatalf("plugin still there after rm: %s", out)
	}

	// What the README tells a user with only the reference to do.
	mp.MustDocker(t, "plugin", "install", "--grant-all-permissions", "--disable", mp.driver)
	mp.configure(t, "info")
	mp.MustDocker(t, "plugin", "enable", mp.driver)
	mp.MustDocker(t, "network", "create", "--driver", mp.driver, "--ipam-driver", mp.driver, "--subnet", "192.168.0.0/16", "net1")
	for _, c := range []string{"c1", "c2"} {
		mp.MustDocker(t, "run", "-d", "--name", c, "--net", "net1", harness.Image, "sleep", "3600")
	}
	mp.ping(t, "c1", mp.containerIP(t, "c2", "net1"))
	mp.ping(t, "c2", mp.containerIP(t, "c1", "net1"))
}
