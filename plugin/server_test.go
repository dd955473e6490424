package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
)

const host = "host-a"

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

type srvEnv struct {
	ipam *drivertest.IPAM
	dp   *drivertest.Dataplane
	srv  *plugin.Server
	ts   *httptest.Server // both APIs
}

func newSrvEnv(t *testing.T, m *etcdtest.Member) *srvEnv {
	t.Helper()
	e := &srvEnv{
		ipam: drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}, ipam.Pool{CIDR: "fd00:10::/48"}),
		dp:   drivertest.NewDataplane(),
	}
	nd := driver.NewNetworkDriver(m.Store, e.dp, host, quietLog(), driver.Options{IPAM: e.ipam})
	id := driver.NewIPAMDriver(e.ipam, host, quietLog())
	e.srv = plugin.NewServer(nd, id, quietLog())
	e.ts = httptest.NewServer(e.srv.Handler("NetworkDriver", "IpamDriver"))
	t.Cleanup(e.ts.Close)
	return e
}

// post sends body (string, or anything else as JSON) and returns the status,
// the Content-Type and the decoded JSON object.
func post(t *testing.T, url, path string, body any) (int, string, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	resp, err := http.Post(url+path, plugin.ContentType, rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: reply is not a JSON object: %q", path, raw)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), out
}

// mustOK posts and fails unless the reply is 200 with Docker's content type.
func mustOK(t *testing.T, url, path string, body any) map[string]any {
	t.Helper()
	code, ct, out := post(t, url, path, body)
	if code != http.StatusOK || ct != plugin.ContentType {
		t.Fatalf("%s: %d %s %v", path, code, ct, out)
	}
	return out
}

// keys lists an object's field names, sorted.
func keys(m any) []string {
	obj, _ := m.(map[string]any)
	var out []string
	for k := range obj {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestActivateManifestPerSocket(t *testing.T) {
	nd := driver.NewNetworkDriver(nil, drivertest.NewDataplane(), host, quietLog(), driver.Options{})
	id := driver.NewIPAMDriver(drivertest.NewIPAM(), host, quietLog())
	srv := plugin.NewServer(nd, id, quietLog())
	tests := []struct {
		implements []string
		want       []any
		served     string // a path that must be served (200)
		notServed  string // a path that must be 404
	}{
		{[]string{"NetworkDriver"}, []any{"NetworkDriver"}, "/NetworkDriver.GetCapabilities", "/IpamDriver.GetCapabilities"},
		{[]string{"IpamDriver"}, []any{"IpamDriver"}, "/IpamDriver.GetDefaultAddressSpaces", "/NetworkDriver.GetCapabilities"},
		{[]string{"NetworkDriver", "IpamDriver"}, []any{"IpamDriver", "NetworkDriver"}, "/IpamDriver.GetCapabilities", "/VolumeDriver.Create"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.implements, "+"), func(t *testing.T) {
			ts := httptest.NewServer(srv.Handler(tc.implements...))
			defer ts.Close()
			out := mustOK(t, ts.URL, "/Plugin.Activate", nil)
			if !reflect.DeepEqual(out, map[string]any{"Implements": tc.want}) {
				t.Errorf("manifest = %v, want Implements %v", out, tc.want)
			}
			mustOK(t, ts.URL, tc.served, nil)
			code, ct, out := post(t, ts.URL, tc.notServed, "{}")
			if code != http.StatusNotFound || ct != plugin.ContentType || !strings.Contains(fmt.Sprint(out["Err"]), tc.notServed) {
				t.Errorf("%s: %d %s %v; want 404 with Err", tc.notServed, code, ct, out)
			}
		})
	}
}

// Every path with a valid request: the reply's exact field names and values.
func TestEndpointsJSON(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	u := e.ts.URL
	netID := strings.Repeat("a", 64)
	epID := strings.Repeat("b", 64)

	out := mustOK(t, u, "/NetworkDriver.GetCapabilities", nil)
	if !reflect.DeepEqual(out, map[string]any{"Scope": "local", "ConnectivityScope": "local"}) {
		t.Errorf("GetCapabilities = %v", out)
	}
	out = mustOK(t, u, "/IpamDriver.GetCapabilities", nil)
	if !reflect.DeepEqual(out, map[string]any{"RequiresMACAddress": false}) {
		t.Errorf("IPAM GetCapabilities = %v", out)
	}
	out = mustOK(t, u, "/IpamDriver.GetDefaultAddressSpaces", nil)
	if !reflect.DeepEqual(out, map[string]any{"LocalDefaultAddressSpace": "CalicoLocalAddressSpace", "GlobalDefaultAddressSpace": "CalicoGlobalAddressSpace"}) {
		t.Errorf("GetDefaultAddressSpaces = %v", out)
	}

	// docker network create --subnet 10.10.1.0/24
	out = mustOK(t, u, "/IpamDriver.RequestPool", `{"AddressSpace":"CalicoLocalAddressSpace","Pool":"10.10.1.0/24","SubPool":"","Options":{},"V6":false}`)
	want := map[string]any{"PoolID": "10.10.1.0/24", "Pool": "10.10.1.0/24", "Data": map[string]any{"com.docker.network.gateway": "0.0.0.0/0"}}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("RequestPool = %v, want %v", out, want)
	}
	mustOK(t, u, "/NetworkDriver.CreateNetwork", map[string]any{
		"NetworkID": netID,
		"Options":   map[string]any{"com.docker.network.enable_ipv6": false, "com.docker.network.generic": map[string]any{}},
		"IPv4Data":  []any{map[string]any{"AddressSpace": "CalicoLocalAddressSpace", "Pool": "10.10.1.0/24", "Gateway": "0.0.0.0/0", "AuxAddresses": map[string]any{}}},
		"IPv6Data":  []any{},
	})

	// docker run --net: address, endpoint, join.
	out = mustOK(t, u, "/IpamDriver.RequestAddress", `{"PoolID":"10.10.1.0/24","Address":"","Options":{}}`)
	if !reflect.DeepEqual(keys(out), []string{"Address", "Data"}) || out["Address"] != "10.10.1.0/32" {
		t.Errorf("RequestAddress = %v", out)
	}
	out = mustOK(t, u, "/IpamDriver.RequestAddress", `{"PoolID":"10.10.1.0/24","Address":"10.10.1.77","Options":{}}`)
	if out["Address"] != "10.10.1.77/32" {
		t.Errorf("RequestAddress --ip = %v", out)
	}
	out = mustOK(t, u, "/IpamDriver.RequestAddress", `{"PoolID":"10.10.1.0/24","Address":"10.10.1.1","Options":{"RequestAddressType":"com.docker.network.gateway"}}`)
	if out["Address"] != "0.0.0.0/0" {
		t.Errorf("gateway RequestAddress = %v", out)
	}

	out = mustOK(t, u, "/NetworkDriver.CreateEndpoint", map[string]any{
		"NetworkID": netID, "EndpointID": epID, "Options": map[string]any{},
		"Interface": map[string]any{"Address": "10.10.1.77/24", "AddressIPv6": "", "MacAddress": ""},
	})
	want = map[string]any{"Interface": map[string]any{"Address": "", "AddressIPv6": "", "MacAddress": "ee:ee:ee:ee:ee:ee"}}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("CreateEndpoint = %v, want %v", out, want)
	}

	out = mustOK(t, u, "/NetworkDriver.Join", map[string]any{"NetworkID": netID, "EndpointID": epID, "SandboxKey": "/var/run/docker/netns/abc", "Options": map[string]any{}})
	want = map[string]any{
		"InterfaceName": map[string]any{"SrcName": dataplane.TempIfName(epID), "DstPrefix": "eth"},
		"Gateway":       "169.254.1.1",
		"GatewayIPv6":   "",
		"StaticRoutes": []any{
			map[string]any{"Destination": "169.254.1.1/32", "RouteType": float64(1), "NextHop": ""},
			map[string]any{"Destination": "10.10.1.0/24", "RouteType": float64(0), "NextHop": "169.254.1.1"},
		},
		"DisableGatewayService": true,
	}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("Join = %v\nwant %v", out, want)
	}
	if _, ok := e.dp.Workload(epID); !ok {
		t.Error("Join did not reach the dataplane")
	}

	out = mustOK(t, u, "/NetworkDriver.EndpointOperInfo", map[string]any{"NetworkID": netID, "EndpointID": epID})
	if v, _ := out["Value"].(map[string]any); v["hostIfName"] != dataplane.HostIfName(epID) || v["ips"] != "10.10.1.77/32" || v["mac"] != "ee:ee:ee:ee:ee:ee" {
		t.Errorf("EndpointOperInfo = %v", out)
	}

	for _, p := range []string{"ProgramExternalConnectivity", "RevokeExternalConnectivity"} {
		out = mustOK(t, u, "/NetworkDriver."+p, map[string]any{"NetworkID": netID, "EndpointID": epID, "Options": map[string]any{}})
		if len(out) != 0 {
			t.Errorf("%s = %v, want {}", p, out)
		}
	}
	for _, p := range []string{"DiscoverNew", "DiscoverDelete"} {
		out = mustOK(t, u, "/NetworkDriver."+p, `{"DiscoveryType":1,"DiscoveryData":{"Address":"10.0.0.2","self":false}}`)
		if len(out) != 0 {
			t.Errorf("%s = %v, want {}", p, out)
		}
	}

	// docker rm, docker network rm.
	mustOK(t, u, "/NetworkDriver.Leave", map[string]any{"NetworkID": netID, "EndpointID": epID})
	if _, ok := e.dp.Workload(epID); ok {
		t.Error("Leave did not reach the dataplane")
	}
	mustOK(t, u, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": netID, "EndpointID": epID})
	for _, a := range []string{"10.10.1.77", "10.10.1.0", "0.0.0.0"} {
		mustOK(t, u, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": "10.10.1.0/24", "Address": a})
	}
	if left := e.ipam.AssignedIPs(); len(left) != 0 {
		t.Errorf("addresses left assigned: %v", left)
	}
	mustOK(t, u, "/IpamDriver.ReleasePool", map[string]any{"PoolID": "10.10.1.0/24"})
	mustOK(t, u, "/NetworkDriver.DeleteNetwork", map[string]any{"NetworkID": netID})

	// Swarm allocation without an address pool is refused with an Err;
	// with one (as swarmkit sends it: no address space) the options come
	// back with the swarm marker, and FreeNetwork answers {}.
	code, _, out := post(t, u, "/NetworkDriver.AllocateNetwork", map[string]any{"NetworkID": netID})
	if code != http.StatusInternalServerError || !strings.Contains(fmt.Sprint(out["Err"]), "swarm") {
		t.Errorf("AllocateNetwork = %d %v", code, out)
	}
	out = mustOK(t, u, "/NetworkDriver.AllocateNetwork", map[string]any{"NetworkID": netID, "Options": map[string]string{"calico.isolation": "off"},
		"IPv4Data": []map[string]any{{"Pool": "0.0.0.0/0", "Gateway": "0.0.0.0/0"}}})
	if opts, _ := out["Options"].(map[string]any); opts["calico.swarm"] != "true" || opts["calico.isolation"] != "off" {
		t.Errorf("AllocateNetwork = %v, want Options with calico.swarm=true and calico.isolation=off", out)
	}
	if out = mustOK(t, u, "/NetworkDriver.FreeNetwork", map[string]any{"NetworkID": netID}); len(out) != 0 {
		t.Errorf("FreeNetwork = %v, want {}", out)
	}
}

func TestIPv6JoinJSON(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	u := e.ts.URL
	netID := strings.Repeat("c", 64)
	epID := strings.Repeat("d", 64)
	out := mustOK(t, u, "/IpamDriver.RequestPool", `{"AddressSpace":"CalicoLocalAddressSpace","Pool":"fd00:10:0:1::/64","V6":true}`)
	if out["PoolID"] != "fd00:10:0:1::/64" || !reflect.DeepEqual(out["Data"], map[string]any{"com.docker.network.gateway": "::/0"}) {
		t.Errorf("RequestPool v6 = %v", out)
	}
	mustOK(t, u, "/NetworkDriver.CreateNetwork", map[string]any{
		"NetworkID": netID,
		"IPv4Data":  []any{map[string]any{"AddressSpace": "CalicoLocalAddressSpace", "Pool": "0.0.0.0/0", "Gateway": "0.0.0.0/0"}},
		"IPv6Data":  []any{map[string]any{"AddressSpace": "CalicoLocalAddressSpace", "Pool": "fd00:10:0:1::/64", "Gateway": "::/0"}},
	})
	out = mustOK(t, u, "/IpamDriver.RequestAddress", `{"PoolID":"fd00:10:0:1::/64"}`)
	if out["Address"] != "fd00:10:0:1::/128" {
		t.Errorf("RequestAddress v6 = %v", out)
	}
	mustOK(t, u, "/NetworkDriver.CreateEndpoint", map[string]any{
		"NetworkID": netID, "EndpointID": epID,
		"Interface": map[string]any{"Address": "10.10.0.9/32", "AddressIPv6": "fd00:10:0:1::/128", "MacAddress": "02:42:ac:11:00:02"},
	})
	out = mustOK(t, u, "/NetworkDriver.Join", map[string]any{"NetworkID": netID, "EndpointID": epID, "SandboxKey": "/x"})
	if out["GatewayIPv6"] != dataplane.GatewayIPv6 {
		t.Errorf("GatewayIPv6 = %v", out["GatewayIPv6"])
	}
	routes, _ := out["StaticRoutes"].([]any)
	// The IPv4 side is any pool (10.10.0.0/16), the IPv6 side its subnet.
	if len(routes) != 4 || !reflect.DeepEqual(routes[2], map[string]any{"Destination": "fe80::1/128", "RouteType": float64(1), "NextHop": ""}) ||
		!reflect.DeepEqual(routes[3], map[string]any{"Destination": "fd00:10:0:1::/64", "RouteType": float64(0), "NextHop": "fe80::1"}) {
		t.Errorf("StaticRoutes = %v", routes)
	}
}

// Malformed, empty, oversized, unknown, wrong method, failing and panicking
// requests: always an Err in Docker's content type, and the right status.
func TestErrors(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	u := e.ts.URL
	big := `{"NetworkID":"` + strings.Repeat("x", plugin.MaxBodyBytes) + `"}`
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		code    int
		errHas  string
		errHas2 string
	}{
		{name: "malformed JSON", path: "/NetworkDriver.Join", body: `{"NetworkID":`, code: 400, errHas: "malformed request to /NetworkDriver.Join: "},
		{name: "wrong JSON type", path: "/IpamDriver.RequestPool", body: `{"V6":"yes"}`, code: 400, errHas: "malformed request to /IpamDriver.RequestPool"},
		{name: "trailing garbage", path: "/NetworkDriver.Leave", body: `{"NetworkID":"a"} {`, code: 400, errHas: "malformed request"},
		{name: "empty body", path: "/NetworkDriver.CreateNetwork", body: ``, code: 400, errHas: "empty body"},
		{name: "empty body where none is needed", path: "/NetworkDriver.GetCapabilities", body: ``, code: 200},
		{name: "oversized", path: "/NetworkDriver.CreateNetwork", body: big, code: 413, errHas: "larger than 1048576 bytes"},
		{name: "oversized where no body is needed", path: "/IpamDriver.GetCapabilities", body: big, code: 413, errHas: "larger than"},
		{name: "unknown path", path: "/NetworkDriver.Frobnicate", body: `{}`, code: 404, errHas: "does not implement /NetworkDriver.Frobnicate"},
		{name: "root", path: "/", body: ``, code: 404, errHas: "does not implement"},
		{name: "GET", method: http.MethodGet, path: "/NetworkDriver.Join", code: 405, errHas: "needs POST"},
		{name: "driver error", path: "/NetworkDriver.Join", body: `{"NetworkID":"n","EndpointID":"` + strings.Repeat("f", 64) + `"}`, code: 500, errHas: "is not known on host host-a"},
		{name: "IPAM error", path: "/IpamDriver.RequestPool", body: `{"Pool":"172.31.0.0/24"}`, code: 500, errHas: "calico-cnm pool add 172.31.0.0/24"},
		{name: "null body decodes as empty request", path: "/NetworkDriver.CreateNetwork", body: `null`, code: 500, errHas: "without a network id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, u+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tc.code, raw)
			}
			if ct := resp.Header.Get("Content-Type"); ct != plugin.ContentType {
				t.Errorf("Content-Type %q", ct)
			}
			var out struct{ Err *string }
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("reply %q: %v", raw, err)
			}
			if tc.code == 200 {
				if out.Err != nil {
					t.Errorf("success with Err %q", *out.Err)
				}
				return
			}
			if out.Err == nil || !strings.Contains(*out.Err, tc.errHas) {
				t.Errorf("Err = %v, want it to contain %q (%s)", out.Err, tc.errHas, raw)
			}
			if tc.code == 405 && resp.Header.Get("Allow") != http.MethodPost {
				t.Errorf("Allow = %q", resp.Header.Get("Allow"))
			}
		})
	}
}

func TestPanicIsA500AndTheServerLives(t *testing.T) {
	m := etcdtest.Start(t)
	e := newSrvEnv(t, m)
	var mu sync.Mutex
	var seen []string
	e.srv.Observer = func(path string, code int, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %d", path, code))
		if d < 0 {
			t.Errorf("negative duration")
		}
	}
	e.ipam.PanicIn = "AutoAssign"
	code, ct, out := post(t, e.ts.URL, "/IpamDriver.RequestAddress", `{"PoolID":"CalicoPoolIPv4"}`)
	if code != http.StatusInternalServerError || ct != plugin.ContentType || !strings.Contains(fmt.Sprint(out["Err"]), "internal error") {
		t.Fatalf("panicking handler: %d %s %v", code, ct, out)
	}
	e.ipam.PanicIn = ""
	out = mustOK(t, e.ts.URL, "/IpamDriver.RequestAddress", `{"PoolID":"CalicoPoolIPv4"}`)
	if out["Address"] == "" {
		t.Fatalf("after the panic: %v", out)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"/IpamDriver.RequestAddress 500", "/IpamDriver.RequestAddress 200"}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("observer saw %v, want %v", seen, want)
	}
}

func unixClient(path string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}
}

// serve runs ServeUnix in the background; the returned func stops it and
// returns its error.
func serve(t *testing.T, srv *plugin.Server, path string, h http.Handler) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeUnix(ctx, path, h) }()
	// Wait for the socket to answer (or ServeUnix to fail).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-errc:
			cancel()
			return func() error { return err }
		default:
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var once sync.Once
	var res error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case res = <-errc:
			case <-time.After(10 * time.Second):
				res = fmt.Errorf("ServeUnix did not return")
			}
		})
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestServeUnix(t *testing.T) {
	nd := driver.NewNetworkDriver(nil, drivertest.NewDataplane(), host, quietLog(), driver.Options{})
	id := driver.NewIPAMDriver(drivertest.NewIPAM(), host, quietLog())
	srv := plugin.NewServer(nd, id, quietLog())
	h := srv.Handler("NetworkDriver", "IpamDriver")

	t.Run("socket mode, serving, removal on shutdown", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "plugins", "calico.sock")
		stop := serve(t, srv, path, h)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
			t.Errorf("socket mode = %v, want socket 0660", fi.Mode())
		}
		resp, err := unixClient(path).Post("http://plugin/Plugin.Activate", plugin.ContentType, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"Implements":["IpamDriver","NetworkDriver"]`) {
			t.Errorf("Activate over the socket: %d %s", resp.StatusCode, body)
		}
		if err := stop(); err != nil {
			t.Fatalf("ServeUnix returned %v after cancel", err)
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("socket still there after shutdown: %v", err)
		}
	})

	t.Run("stale socket is replaced", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "calico.sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close() // the file stays, nobody answers: a crashed daemon's socket
		if _, err := os.Lstat(path); err != nil {
			t.Fatal(err)
		}
		stop := serve(t, srv, path, h)
		resp, err := unixClient(path).Post("http://plugin/NetworkDriver.GetCapabilities", plugin.ContentType, nil)
		if err != nil {
			t.Fatalf("serving on a replaced stale socket: %v", err)
		}
		resp.Body.Close()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("live socket is refused", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "calico.sock")
		stop1 := serve(t, srv, path, h)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.ServeUnix(ctx, path, h)
		if err == nil || !strings.Contains(err.Error(), "already listening") {
			t.Fatalf("second ServeUnix on a live socket: %v", err)
		}
		// The first server is unharmed.
		resp, err := unixClient(path).Post("http://plugin/Plugin.Activate", plugin.ContentType, nil)
		if err != nil {
			t.Fatalf("first server broken: %v", err)
		}
		resp.Body.Close()
		if err := stop1(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a regular file is not removed", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "calico.sock")
		if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := srv.ServeUnix(context.Background(), path, h)
		if err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("ServeUnix over a regular file: %v", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "precious" {
			t.Error("regular file clobbered")
		}
	})

	t.Run("shutdown waits for a running request", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "calico.sock")
		started := make(chan struct{})
		release := make(chan struct{})
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			w.Write([]byte("{}"))
		})
		stop := serve(t, srv, path, slow)
		done := make(chan error, 1)
		go func() {
			resp, err := unixClient(path).Post("http://plugin/x", plugin.ContentType, nil)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		<-started
		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		time.Sleep(50 * time.Millisecond)
		close(release)
		if err := <-done; err != nil {
			t.Errorf("in-flight request cut off: %v", err)
		}
		if err := <-stopped; err != nil {
			t.Error(err)
		}
	})
}
