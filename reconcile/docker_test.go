package reconcile_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/reconcile"
)

// fakeDockerd answers the few Engine API calls the reconciler makes, as
// dockerd 20.10 (API 1.41) does.
type fakeDockerd struct {
	mu       sync.Mutex
	paths    []string
	networks []map[string]any
	inspect  map[string]any // by id; missing = 404
	failList bool
}

func (f *fakeDockerd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	w.Header().Set("Api-Version", "1.41")
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/_ping":
		w.Write([]byte("OK"))
	case r.URL.Path == "/v1.41/networks":
		if f.failList {
			w.WriteHeader(500)
			json.NewEncoder(w).Encode(map[string]string{"message": "boom"})
			return
		}
		json.NewEncoder(w).Encode(f.networks)
	case strings.HasPrefix(r.URL.Path, "/v1.41/networks/"):
		n, ok := f.inspect[strings.TrimPrefix(r.URL.Path, "/v1.41/networks/")]
		if !ok {
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(map[string]string{"message": "network not found"})
			return
		}
		json.NewEncoder(w).Encode(n)
	default:
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(map[string]string{"message": "page not found"})
	}
}

func TestDockerSourceView(t *testing.T) {
	f := &fakeDockerd{
		networks: []map[string]any{
			{"Id": "n1", "Name": "net1", "Driver": "calico"},
			{"Id": "n2", "Name": "bridge", "Driver": "bridge"},
			{"Id": "n3", "Name": "host", "Driver": "host"},
			{"Id": "n4", "Name": "none", "Driver": "null"},
			{"Id": "n5", "Name": "gone", "Driver": "calico"}, // removed before its inspect
		},
		inspect: map[string]any{
			"n1": map[string]any{"Id": "n1", "Name": "net1", "Driver": "calico", "Containers": map[string]any{
				"c1":     map[string]any{"Name": "c1", "EndpointID": "e1", "IPv4Address": "192.168.0.1/32", "IPv6Address": "fd00::1/128"},
				"ep-e2":  map[string]any{"Name": "c2", "EndpointID": "e2", "IPv4Address": "192.168.0.2/32"},
				"no-eid": map[string]any{"Name": "weird"},
			}},
			"n2": map[string]any{"Id": "n2", "Name": "bridge", "Driver": "bridge", "Containers": map[string]any{
				"c3": map[string]any{"Name": "c3", "EndpointID": "e3", "IPv4Address": "172.17.0.2/16"},
			}},
		},
	}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	src, err := reconcile.NewDockerSource("tcp://"+ts.Listener.Addr().String(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	v, err := src.View(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	want := map[string]reconcile.DockerEndpoint{
		"e1": {ID: "e1", Network: "n1", IPs: addrs("192.168.0.1", "fd00::1")},
		"e2": {ID: "e2", Network: "n1", IPs: addrs("192.168.0.2")},
		"e3": {ID: "e3", Network: "n2", IPs: addrs("172.17.0.2")},
	}
	if !reflect.DeepEqual(v.Endpoints, want) {
		t.Errorf("view:\n got %+v\nwant %+v", v.Endpoints, want)
	}
	f.mu.Lock()
	for _, p := range f.paths {
		if strings.Contains(p, "/networks") && !strings.Contains(p, "/v1.41/") {
			t.Errorf("request %s did not use the negotiated API version 1.41", p)
		}
		if strings.HasSuffix(p, "/n3") || strings.HasSuffix(p, "/n4") {
			t.Errorf("inspected a host/null network: %s", p)
		}
	}
	f.failList = true
	f.mu.Unlock()
	if _, err := src.View(context.Background()); err == nil {
		t.Error("a failing network list gave a view")
	}

	// Nobody listening: an error, never an empty view.
	ts.Close()
	if v, err := src.View(context.Background()); err == nil {
		t.Errorf("unreachable Docker gave a view: %+v", v)
	}
	if _, err := reconcile.NewDockerSource("bogus://x", quietLog()); err == nil {
		t.Error("a malformed docker host was accepted")
	}
}

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}
