package plugin

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/vxlan"
)

// runSyncer runs the daemon's datastore syncer over store until ctx ends.
func runSyncer(t *testing.T, ctx context.Context, store *datastore.Store) *datastore.Syncer {
	t.Helper()
	s, err := datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: append(datastore.Kinds(), ipam.Kinds()...), ResyncInterval: time.Hour, Log: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Run(ctx) }()
	return s
}

func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// TestFollowFormatKicksOnRestore: the daemon's follower kicks the
// reconciler when a restore rewrites the format record.
func TestFollowFormatKicksOnRestore(t *testing.T) {
	store := etcdtest.Start(t).Store
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.EnsureFormat(ctx, "", "v1"); err != nil {
		t.Fatal(err)
	}
	b, err := store.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kick := make(chan struct{}, 1)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		followFormat(fctx, subscribeFormat(fctx, runSyncer(t, fctx, store)), kick, quietLogger())
	}()
	defer func() { stop(); <-done }()
	// The follower reads the record once when it starts; a restore made
	// before that read is its starting point, so restore until it kicks.
	for {
		if _, err := store.Restore(ctx, b, "v1"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-kick:
			return
		case <-time.After(time.Second):
		case <-ctx.Done():
			t.Fatal("no kick after the restores")
		}
	}
}

// TestEnsureFormatRemembersTheCluster: the daemon keeps the cluster id in
// its state dir and writes it back into an empty datastore.
func TestEnsureFormatRemembersTheCluster(t *testing.T) {
	ctx := context.Background()
	cfg := Config{StateDir: t.TempDir(), Version: "v-test"}
	first, err := ensureFormat(ctx, cfg, etcdtest.Start(t).Store, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, ClusterIDFile))
	if err != nil || strings.TrimSpace(string(b)) != first.ClusterID {
		t.Fatalf("remembered %q, %v; want %s", b, err, first.ClusterID)
	}
	// The datastore is lost: the next start writes the same id back.
	again, err := ensureFormat(ctx, cfg, etcdtest.Start(t).Store, quietLogger())
	if err != nil || again.ClusterID != first.ClusterID || again.WrittenBy != "v-test" {
		t.Fatalf("on an empty datastore: %+v, %v; want cluster %s", again, err, first.ClusterID)
	}
}

func TestSummarizeRouting(t *testing.T) {
	tests := []struct {
		name string
		st   routing.Status
		want datastore.RoutingSummary
	}{
		{
			name: "BGP: sessions counted by state",
			st:   routing.Status{Peers: []routing.PeerStatus{{State: routing.PeerEstablished}, {State: "Active"}, {State: routing.PeerEstablished}}},
			want: datastore.RoutingSummary{BGP: true, Peers: 3, Established: 2},
		},
		{
			name: "VXLAN without BGP: nodes without a route are named",
			st: routing.Status{BGPOff: true, VXLAN: &routing.VXLANStatus{Device: vxlan.Device, Nodes: []routing.VXLANNodeStatus{
				{Name: "b", Routes: routing.RouteVXLAN}, {Name: "c", Routes: routing.RouteNone}}}},
			want: datastore.RoutingSummary{VXLAN: true, Unreached: []string{"c"}},
		},
		{
			name: "no VXLAN pool: reachability is BGP's",
			st:   routing.Status{VXLAN: &routing.VXLANStatus{}},
			want: datastore.RoutingSummary{BGP: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := summarizeRouting(tc.st)
			if got.BGP != tc.want.BGP || got.Peers != tc.want.Peers || got.Established != tc.want.Established || got.VXLAN != tc.want.VXLAN || strings.Join(got.Unreached, ",") != strings.Join(tc.want.Unreached, ",") {
				t.Errorf("summary %+v, want %+v", *got, tc.want)
			}
		})
	}
}

// TestFollowFormatSeesARestoreWhileItsWatchWasDown: the member behind the
// daemon is replaced by an empty one and restored (the embedded member's
// data lost). The follower's watch waits for the old member's revisions
// until the daemon's next request meets the lower revision and ends it;
// the restore happened before the follower watches again, so it must read
// the record when it re-watches, not only at the next resync (an hour).
func TestFollowFormatSeesARestoreWhileItsWatchWasDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	daemon := m.Client(t)
	f, err := daemon.EnsureFormat(ctx, "", "v1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 { // the old member's revision, above the new one's
		if err := daemon.Txn(ctx, datastore.Put(datastore.NetworkKey(string(rune('a'+i))), []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := daemon.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := daemon.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kick := make(chan struct{}, 1)
	fctx, stop := context.WithCancel(ctx)
	// The follower starts from the old member's records: the syncer has
	// read them and the subscription holds them before the member goes
	// (a follower that first reads the restored records has nothing to
	// follow: the reconciler runs at a daemon's start anyway).
	records := runSyncer(t, fctx, daemon)
	if err := records.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	sub := subscribeFormat(fctx, records)
	done := make(chan struct{})
	go func() { defer close(done); followFormat(fctx, sub, kick, quietLogger()) }()
	defer func() { stop(); <-done }()

	m.Wipe(t)
	if _, err := m.Store.EnsureFormat(ctx, f.ClusterID, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Store.Restore(ctx, b, "v1"); err != nil {
		t.Fatal(err)
	}
	// The daemon's other traffic (heartbeat, passes) meets the new member.
	etcdtest.Reach(t, daemon)
	select {
	case <-kick:
	case <-ctx.Done():
		t.Fatal("the follower missed the restore made while its watch was down")
	}
}
