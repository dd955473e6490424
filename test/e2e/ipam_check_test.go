package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// TestIPAMCheckAsksDocker (issue 12 item 1, with a real dockerd): `ipam
// check --release` frees an address only when Docker on its node does not
// know it. An address Docker shows on a container is in use even without
// an endpoint record (that is how an address calico-ipam serves to another
// network driver looks); an address only the IPAM socket handed out, that
// no container holds, is a leak once old enough; and with Docker
// unreachable nothing is released.
func TestIPAMCheckAsksDocker(t *testing.T) {
	t.Parallel()
	// Only `ipam check` may release the orphan: the daemon's own reconcile
	// would, once the orphan is older than its grace (on a loaded machine
	// the check came 97 s after the request, and found nothing left).
	h := newFaultHost(t, "ipamcheck", harness.HostOptions{}, nil, "--reconcile-grace", "1h")
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "net1")
	h.MustDocker(t, "run", "-d", "--name", "c1", "--net", "net1", harness.Image, "sleep", "3600")
	ip := h.containerIP(t, "c1", "net1")
	// Only Docker knows c1's address is in use now.
	h.MustExec(t, "etcdctl", "--endpoints", "http://127.0.0.1:2379", "del", "--prefix", "/calico-cnm/v1/endpoints/")

	// An address requested on the IPAM socket that no container got.
	sock := filepath.Join(h.PluginDir, harness.IpamSocket)
	out := h.MustExec(t, "curl", "-sS", "-f", "--max-time", "10", "--unix-socket", sock,
		"-d", `{"PoolID":"CalicoPoolIPv4"}`, "http://plugin/IpamDriver.RequestAddress")
	var got struct{ Address string }
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Address == "" {
		t.Fatalf("RequestAddress on the IPAM socket: %q (%v)", out, err)
	}
	orphan := strings.TrimSuffix(got.Address, "/32")
	if n := h.usedIPs(t); n != 2 {
		t.Fatalf("fixture: %d addresses used, want c1's and the orphan", n)
	}

	check := func(dockerHost string) string {
		t.Helper()
		out, err := h.Exec(t, "env", "NODENAME=ipamcheck", "DOCKER_HOST="+dockerHost,
			h.bin, "ipam", "check", "--release", "--min-age", "0s")
		if err != nil {
			t.Fatalf("ipam check --release: %v\n%s", err, out)
		}
		return out
	}
	out = check("unix:///nonexistent/docker.sock")
	if n := h.usedIPs(t); n != 2 {
		t.Fatalf("with Docker unreachable, ipam check --release released something (%d addresses left):\n%s", n, out)
	}
	out = check("unix://" + h.DockerSock)
	if n := h.usedIPs(t); n != 1 {
		t.Fatalf("after ipam check --release %d addresses are used, want only c1's %s (the orphan %s released):\n%s", n, ip, orphan, out)
	}
	if !strings.Contains(out, "fixed 1 problem(s)") {
		t.Errorf("ipam check --release output:\n%s", out)
	}
	// c1 still has its address: no one else may get it.
	if o, err := h.Docker(t, "run", "--rm", "--net", "net1", "--ip", ip.String(), harness.Image, "true"); err == nil {
		t.Errorf("a second container got c1's address %s after ipam check --release:\n%s", ip, o)
	}
}
