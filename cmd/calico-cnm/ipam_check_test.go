package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fakeDockerd answers the Engine API calls of a Docker view (network list
// and inspect, engine info, API 1.41) with one bridge network holding containers.
func fakeDockerd(t *testing.T, containerIPs ...string) string {
	t.Helper()
	containers := map[string]any{}
	for i, ip := range containerIPs {
		containers[fmt.Sprintf("c%d", i)] = map[string]any{"EndpointID": fmt.Sprintf("ep%d", i), "IPv4Address": ip + "/32"}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Api-Version", "1.41")
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/_ping":
			w.Write([]byte("OK"))
		case strings.HasSuffix(r.URL.Path, "/info"):
			json.NewEncoder(w).Encode(map[string]any{"ID": "FAKE:ENGINE", "Name": "fakedockerd"})
		case strings.HasSuffix(r.URL.Path, "/networks"):
			json.NewEncoder(w).Encode([]map[string]any{{"Id": "n1", "Name": "other", "Driver": "macvlan"}})
		case strings.HasSuffix(r.URL.Path, "/networks/n1"):
			json.NewEncoder(w).Encode(map[string]any{"Id": "n1", "Name": "other", "Driver": "macvlan", "Containers": containers})
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(map[string]string{"message": "page not found"})
		}
	}))
	t.Cleanup(srv.Close)
	return "tcp://" + strings.TrimPrefix(srv.URL, "http://")
}

// Issue 12 item 1: `ipam check --release` releases only what is certainly
// dead: old enough, unknown to Docker on the node that owns it, not a
// reservation, in no endpoint record.
func TestCLIIPAMCheckReleasesOnlyDeadAddresses(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	ctx := context.Background()
	hourAgo := func() time.Time { return time.Now().Add(-time.Hour) }
	old := ipam.New(store, ipam.Options{Log: quietLog(), Now: hourAgo})
	young := ipam.New(store, ipam.Options{Log: quietLog()})
	if _, err := old.AddPool(ctx, ipam.Pool{CIDR: "10.60.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	assign := func(e *ipam.Engine, host, handle string, attrs map[string]string) net.IP {
		t.Helper()
		n, err := e.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: handle, Attrs: attrs})
		if err != nil {
			t.Fatal(err)
		}
		return n.IP
	}
	h1 := map[string]string{ipam.AttrNode: "h1"}
	dead := assign(old, "h1", "cnm.dead", h1)
	assign(young, "h1", "cnm.young", h1) // between RequestAddress and CreateEndpoint
	assign(old, "h1", "cnm.aux", map[string]string{ipam.AttrNode: "h1", ipam.AttrReserved: ipam.ReservedAux})
	foreign := assign(old, "h1", "cnm.foreign", h1) // served to another driver's network
	assign(old, "h2", "cnm.remote", map[string]string{ipam.AttrNode: "h2"})
	live := assign(old, "h1", "cnm.live", h1)
	id := "live" + strings.Repeat("0", 60)
	rec := datastore.Endpoint{ID: id, Network: "net1", Node: "h1", IPv4: live.String() + "/32", MAC: "ee:ee:ee:ee:ee:ee", HostIfName: "cali" + id[:11]}
	if err := store.Txn(ctx, datastore.Create(datastore.EndpointKey("h1", id), datastore.MustJSON(rec))); err != nil {
		t.Fatal(err)
	}
	held := func() map[string]bool {
		t.Helper()
		as, err := young.Allocations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, a := range as {
			out[a.HandleID] = true
		}
		return out
	}
	all := []string{"cnm.dead", "cnm.young", "cnm.aux", "cnm.foreign", "cnm.remote", "cnm.live"}

	// Docker unreachable: nothing can be proven dead, nothing is released.
	down := map[string]string{"NODENAME": "h1", "DOCKER_HOST": "tcp://127.0.0.1:1"}
	r := cliRun(down, withEtcd(ep, "ipam", "check", "--release")...)
	if r.code != exitOK && r.code != exitProblem {
		t.Fatalf("ipam check --release with Docker down: %s", r)
	}
	for _, h := range all {
		if !held()[h] {
			t.Errorf("with Docker unreachable, --release freed %s", h)
		}
	}

	env := map[string]string{"NODENAME": "h1", "DOCKER_HOST": fakeDockerd(t, foreign.String())}
	r = cliRun(env, withEtcd(ep, "ipam", "check", "--release")...)
	if r.code != exitOK {
		t.Fatalf("ipam check --release: %s", r)
	}
	got := held()
	if got["cnm.dead"] {
		t.Errorf("the dead address %s (old, unknown to Docker, no record) was not released:\n%s", dead, r)
	}
	for _, h := range all[1:] {
		if !got[h] {
			t.Errorf("ipam check --release freed %s, which is not certainly dead:\n%s", h, r)
		}
	}
	if !strings.Contains(r.stdout, "cnm.remote") || !strings.Contains(r.stdout, "h2") {
		t.Errorf("the other node's unverifiable address is not reported:\n%s", r.stdout)
	}
}
