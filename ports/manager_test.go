package ports

import (
	"context"
	"slices"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestManagerIgnoresOtherEngines: endpoint records that a host sharing
// this node name wrote (another Docker engine ID) are neither published
// here nor count as taking a host port; records of this engine and records
// from before engine IDs were recorded are.
func TestManagerIgnoresOtherEngines(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	bind := []datastore.PortBinding{{Proto: "tcp", HostPort: 18080, Port: 8080}}
	for id, engine := range map[string]string{"mine": "ENGINE-A", "clone": "ENGINE-B", "legacy": ""} {
		ep := datastore.Endpoint{ID: id, Node: "n1", IPv4: "10.0.0.1/32", Joined: true, EngineID: engine, Ports: bind}
		if err := m.Store.Txn(ctx, datastore.Create(datastore.EndpointKey("n1", id), datastore.MustJSON(ep))); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		engine string
		want   []string
	}{
		{"ENGINE-A", []string{"legacy", "mine"}},
		{"", []string{"clone", "legacy", "mine"}}, // engine unknown: no record can be told apart
	} {
		mgr := NewManager(m.Store, etcdtest.Records(t, m.Store), "n1", nil, nil, false, func() string { return tc.engine }, nil)
		recs, err := mgr.load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries(recs) {
			got = append(got, e.endpoint)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("engine %q: published %q, want %q", tc.engine, got, tc.want)
		}
	}
}
