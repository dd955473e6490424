package nodes_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nodes"
)

func TestDiagnose(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	bgp := func(est, peers int) *datastore.RoutingSummary {
		return &datastore.RoutingSummary{BGP: true, Established: est, Peers: peers}
	}
	up := func(name, version string, seen *time.Time, r *datastore.RoutingSummary) nodes.Info {
		return nodes.Info{Name: name, Alive: true, Version: version, LastSeen: seen, Routing: r}
	}
	tests := []struct {
		name string
		list []nodes.Info
		want map[string][]string
	}{
		{
			name: "healthy cluster: nothing to say",
			list: []nodes.Info{up("a", "v1", ago(10*time.Second), bgp(2, 2)), up("b", "v1", ago(5*time.Second), bgp(2, 2)), up("c", "v1", ago(time.Second), bgp(2, 2))},
			want: map[string][]string{},
		},
		{
			name: "down nodes: recently, long ago (with the way out), never heard of",
			list: []nodes.Info{
				up("a", "v1", ago(time.Second), bgp(1, 1)),
				{Name: "b", LastSeen: ago(40 * time.Second)},
				{Name: "c", LastSeen: ago(3 * time.Hour)},
				{Name: "d"},
			},
			want: map[string][]string{
				"b": {"daemon down (last seen 40s ago)"},
				"c": {"daemon down, unseen for 3h0m0s (gone for good? `calico-cnm node delete c`)"},
				"d": {"daemon down"},
			},
		},
		{
			name: "alive but its heartbeat stopped",
			list: []nodes.Info{up("a", "v1", ago(10*time.Minute), nil)},
			want: map[string][]string{"a": {"no heartbeat for 10m0s (its daemon cannot write to the datastore?)"}},
		},
		{
			name: "version skew: the minority is flagged; down nodes do not count",
			list: []nodes.Info{up("a", "v2", ago(time.Second), nil), up("b", "v1", ago(time.Second), nil), up("c", "v1", ago(time.Second), nil), {Name: "d", Version: "v0", LastSeen: ago(time.Second)}},
			want: map[string][]string{
				"a": {"version skew: runs v2, most nodes run v1"},
				"d": {"daemon down (last seen 1s ago)"},
			},
		},
		{
			name: "version skew without a majority: all flagged",
			list: []nodes.Info{up("a", "v2", ago(time.Second), nil), up("b", "v1", ago(time.Second), nil)},
			want: map[string][]string{
				"a": {"version skew: the cluster runs v1, v2"},
				"b": {"version skew: the cluster runs v1, v2"},
			},
		},
		{
			name: "sessions: none at all, some down; a lone node needs none",
			list: []nodes.Info{up("a", "v1", ago(time.Second), bgp(0, 0)), up("b", "v1", ago(time.Second), bgp(1, 3)), up("c", "v1", ago(time.Second), bgp(2, 2))},
			want: map[string][]string{
				"a": {"no BGP sessions"},
				"b": {"2 of 3 BGP sessions not established"},
			},
		},
		{
			name: "a lone node without sessions is fine",
			list: []nodes.Info{up("a", "v1", ago(time.Second), bgp(0, 0))},
			want: map[string][]string{},
		},
		{
			name: "VXLAN: unreached nodes are named",
			list: []nodes.Info{up("a", "v1", ago(time.Second), &datastore.RoutingSummary{VXLAN: true, Unreached: []string{"b", "c"}})},
			want: map[string][]string{"a": {"no route to b, c"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes.Diagnose(tc.list, now, nodes.DefaultUnseenAfter)
			got := map[string][]string{}
			for _, n := range tc.list {
				if len(n.Problems) > 0 {
					got[n.Name] = n.Problems
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestListShowsHeartbeatsAndDeleteRemovesThem: the heartbeat's version,
// time and routing reach `node list`; `node delete` removes it with the
// node.
func TestListShowsHeartbeatsAndDeleteRemovesThem(t *testing.T) {
	store := etcdtest.Start(t).Store
	ctx := context.Background()
	eng := ipam.New(store, ipam.Options{Log: quietLog()})
	seen := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	r := &datastore.RoutingSummary{BGP: true, Peers: 2, Established: 1}
	if err := store.PutSeen(ctx, datastore.NodeSeen{Node: "h1", Version: "v1.2", Format: 1, Seen: seen, Routing: r}); err != nil {
		t.Fatal(err)
	}
	list, err := nodes.List(ctx, store, eng)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "h1" || list[0].Version != "v1.2" || list[0].LastSeen == nil || !list[0].LastSeen.Equal(seen) || !reflect.DeepEqual(list[0].Routing, r) {
		t.Fatalf("node list = %+v; want h1 with its heartbeat", list)
	}
	if _, err := nodes.Delete(ctx, store, eng, "h1", false, quietLog()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, datastore.NodeSeenKey("h1")); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("heartbeat after node delete: %v", err)
	}
}
