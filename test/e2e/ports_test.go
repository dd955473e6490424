package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/ports"
	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// portsImage is busybox plus the udpecho tool (at its build path).
const portsImage = "bb-udp"

// httpGet fetches url with curl from h's namespace (container ""), or
// with udpecho's HTTP client from inside container on h.
func httpGet(t *testing.T, h *harness.Host, udpecho, container, url string) (string, error) {
	t.Helper()
	if container == "" {
		return h.Exec(t, "curl", "-sS", "-m", "3", url)
	}
	hostPort := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	return h.Docker(t, "exec", container, udpecho, "get", hostPort)
}

// udpAsk sends one datagram to addr and returns the answer.
func udpAsk(t *testing.T, h *harness.Host, udpecho, container, addr string) (string, error) {
	t.Helper()
	if container == "" {
		return h.Exec(t, udpecho, "ask", addr, "hi")
	}
	return h.Docker(t, "exec", container, udpecho, "ask", addr, "hi")
}

// mustAnswer waits until the published TCP (httpd: "hello") and UDP
// (udpecho) ports answer from where.
func mustAnswer(t *testing.T, h *harness.Host, udpecho, container, tcpURL, udpAddr, where string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, where+": "+tcpURL, func() error {
		out, err := httpGet(t, h, udpecho, container, tcpURL)
		if err != nil || !strings.Contains(out, "hello") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if udpAddr == "" {
		return
	}
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, where+": udp "+udpAddr, func() error {
		out, err := udpAsk(t, h, udpecho, container, udpAddr)
		if err != nil || !strings.Contains(out, "echo:hi") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

func portsTable(t *testing.T, h *harness.Host) string {
	t.Helper()
	out, err := h.Exec(t, "nft", "list", "table", "ip", ports.TableName)
	if err != nil {
		return ""
	}
	return out
}

func caliCount(t *testing.T, h *harness.Host) int {
	t.Helper()
	return strings.Count(h.MustExec(t, "ip", "-o", "link", "show"), ": cali")
}

// TestPublishedPorts: -p TCP and UDP ports answer at the host's address
// and 127.0.0.1 from the host, from another host (a cluster node and a
// machine that is not one), from a container on another host and from
// containers of the same host (hairpin, its own port too), whatever the
// networks' isolation; -P with --expose takes an ephemeral port; a port
// published already is refused at docker run and leaves nothing; docker rm
// leaves no rule.
func TestPublishedPorts(t *testing.T) {
	t.Parallel()
	c := newBGPCluster(t)
	udpecho := harness.BuildPackage(t, "./test/e2e/internal/udpecho")
	a, b := c.addHost(t, "ppA"), c.addHost(t, "ppB")
	client := c.fabric.AddHost(t, "ppC", harness.HostOptions{NoDockerd: true})
	for _, h := range []*bgpHost{a, b} {
		h.ImportImage(t, portsImage, udpecho)
		h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.30.0/24", "other")
	}
	serve := fmt.Sprintf("echo hello > /tmp/index.html; %s serve 5353 & exec httpd -f -p 8080 -h /tmp", udpecho)
	a.MustDocker(t, "run", "-d", "--name", "web", "--net", mhNetwork, "-p", "18080:8080", "-p", "15353:5353/udp", portsImage, "sh", "-c", serve)
	aIP := a.IP.String()
	tcpURL, udpAddr := "http://"+aIP+":18080/", aIP+":15353"

	mustAnswer(t, a.Host, udpecho, "", tcpURL, udpAddr, "from the host, its address")
	mustAnswer(t, a.Host, udpecho, "", "http://127.0.0.1:18080/", "127.0.0.1:15353", "from the host, 127.0.0.1")
	mustAnswer(t, b.Host, udpecho, "", tcpURL, udpAddr, "from another node")
	mustAnswer(t, client, udpecho, "", tcpURL, udpAddr, "from a machine outside the cluster")
	b.MustDocker(t, "run", "-d", "--name", "far", "--net", "other", portsImage, "sleep", "3600")
	mustAnswer(t, b.Host, udpecho, "far", tcpURL, udpAddr, "from a container on another host (another network)")
	a.MustDocker(t, "run", "-d", "--name", "near", "--net", "other", portsImage, "sleep", "3600")
	mustAnswer(t, a.Host, udpecho, "near", tcpURL, udpAddr, "hairpin from a container of the same host (another network)")
	mustAnswer(t, a.Host, udpecho, "web", tcpURL, udpAddr, "the container to its own published port")
	// The container saw the outside client's own address: no masquerade.
	// The server keeps a closed connection in TIME_WAIT, unless the
	// client's reset ended it early: ask again until one is seen.
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "web's connections show the client "+client.IP.String(), func() error {
		if _, err := httpGet(t, client, udpecho, "", tcpURL); err != nil {
			return err
		}
		if out := a.MustDocker(t, "exec", "web", "netstat", "-tn"); !strings.Contains(out, client.IP.String()+":") {
			return fmt.Errorf("not in web's connections:\n%s", out)
		}
		return nil
	})

	// -P with --expose: an ephemeral host port.
	a.MustDocker(t, "run", "-d", "--name", "auto", "--net", mhNetwork, "-P", "--expose", "9090", portsImage, "sh", "-c", "echo hello > /tmp/index.html; exec httpd -f -p 9090 -h /tmp")
	// `docker port` cannot show it (moby/libnetwork#2451): the CLI does.
	var rows []struct {
		Node     string `json:"node"`
		Port     int    `json:"port"`
		HostPort int    `json:"hostPort"`
		Proto    string `json:"proto"`
	}
	listing := c.mustCtl(t, "network", "ports", "-o", "json")
	if err := json.Unmarshal([]byte(listing), &rows); err != nil {
		t.Fatalf("network ports -o json: %v\n%s", err, listing)
	}
	hostPort := 0
	for _, r := range rows {
		if r.Port == 9090 && r.Proto == "tcp" && r.Node == a.Name {
			hostPort = r.HostPort
		}
	}
	if hostPort != ports.EphemeralFirst {
		t.Errorf("-P took host port %d, want the first ephemeral port %d:\n%s", hostPort, ports.EphemeralFirst, listing)
	}
	if table := c.mustCtl(t, "network", "ports"); !strings.Contains(table, "8080/tcp -> 0.0.0.0:18080") || !strings.Contains(table, "5353/udp -> 0.0.0.0:15353") {
		t.Errorf("network ports lacks web's bindings:\n%s", table)
	}
	if wide := c.mustCtl(t, "get", "endpoints", "-o", "wide"); !strings.Contains(wide, "8080/tcp -> 0.0.0.0:18080") {
		t.Errorf("get endpoints -o wide lacks web's published port:\n%s", wide)
	}
	mustAnswer(t, b.Host, udpecho, "", fmt.Sprintf("http://%s:%d/", aIP, hostPort), "", "-P port from another node")

	// A host port published already: a clear error, and nothing left.
	rulesBefore, calisBefore := portsTable(t, a.Host), caliCount(t, a.Host)
	out, err := a.Docker(t, "run", "-d", "--name", "dup", "--net", mhNetwork, "-p", "18080:80", portsImage, "sleep", "3600")
	if err == nil || !strings.Contains(out+err.Error(), "tcp port 18080 on 0.0.0.0: it is published by endpoint") {
		t.Errorf("second -p 18080: err %v, output %s; want the port-in-use error", err, out)
	}
	if after := portsTable(t, a.Host); after != rulesBefore {
		t.Errorf("the refused container changed the rules:\nbefore:\n%s\nafter:\n%s", rulesBefore, after)
	}
	if n := caliCount(t, a.Host); n != calisBefore {
		t.Errorf("the refused container left a veth: %d cali interfaces, were %d", n, calisBefore)
	}
	mustAnswer(t, b.Host, udpecho, "", tcpURL, udpAddr, "first container's port after the refused one")

	// docker rm: the rules go.
	a.MustDocker(t, "rm", "-f", "web", "auto")
	harness.Eventually(t, 10*time.Second, 200*time.Millisecond, "no published port rule after docker rm", func() error {
		if tbl := portsTable(t, a.Host); strings.Contains(tbl, "dnat to") {
			return fmt.Errorf("rules left:\n%s", tbl)
		}
		return nil
	})
	if _, err := httpGet(t, b.Host, "", "", tcpURL); err == nil {
		t.Errorf("port 18080 still answers after docker rm")
	}
}
