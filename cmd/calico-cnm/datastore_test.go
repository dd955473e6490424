package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestCLIDatastore: `datastore backup` writes a 0600 file that `datastore
// restore` brings back; restore refuses another cluster's file and a newer
// format's; every command refuses a datastore in a newer format, except
// `datastore info`, which tells.
func TestCLIDatastore(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Store
	ctx := context.Background()
	f, err := store.EnsureFormat(ctx, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	net1 := datastore.NetworkKey("net1")
	if err := store.Txn(ctx, datastore.Put(net1, datastore.MustJSON(datastore.Network{ID: "net1", Name: "one"}))); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.json")

	other := etcdtest.Start(t)
	if _, err := other.Store.EnsureFormat(ctx, "", "test"); err != nil {
		t.Fatal(err)
	}
	newerFile := filepath.Join(dir, "newer.json")

	runSteps(t, nil, []step{
		{name: "info", args: withEtcd(ep, "datastore", "info"), stdout: "~format:      1 \\(this calico-cnm reads up to 1\\)\ncluster id:  " + f.ClusterID},
		{name: "backup", args: withEtcd(ep, "datastore", "backup", file), stdout: "~backed up 1 records of cluster " + f.ClusterID + " \\(format 1, etcd revision [0-9]+\\) to ",
			check: func(t *testing.T, _ result) {
				st, err := os.Stat(file)
				if err != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("backup file: %v, mode %v; want 0600", err, st.Mode())
				}
				// A change after the backup, undone by the restore.
				if err := store.Txn(ctx, datastore.Put(net1, []byte(`{"id":"net1","name":"changed"}`)), datastore.Put(datastore.NetworkKey("net2"), []byte(`{"id":"net2"}`))); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "restore", args: withEtcd(ep, "datastore", "restore", file), stdout: "~restored .* into cluster " + f.ClusterID + ": 1 records written, 1 deleted, 0 unchanged; format 1\n",
			check: func(t *testing.T, _ result) {
				var n datastore.Network
				if _, err := store.GetJSON(ctx, net1, &n); err != nil || n.Name != "one" {
					t.Fatalf("net1 after restore = %+v, %v", n, err)
				}
			}},
		{name: "info shows a restore hold", args: withEtcd(ep, "datastore", "info"), stdout: "~restore:     new addresses held back: waiting for h1, h2 to reconcile \\(at most until ",
			before: func(t *testing.T) {
				cur, rev, err := store.ReadFormat(ctx)
				if err != nil {
					t.Fatal(err)
				}
				cur.Restore = &datastore.RestoreHold{Since: time.Now(), Complete: true, Pending: []string{"h1", "h2"}}
				if err := store.Txn(ctx, datastore.Update(datastore.FormatKey, datastore.MustJSON(cur), rev)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "restore into another cluster", args: withEtcd(other.Config.EmbeddedClientURL, "datastore", "restore", file), code: exitFailed, stderr: "backup belongs to another cluster: the backup was taken from cluster " + f.ClusterID},
		{name: "restore of a newer format", args: withEtcd(ep, "datastore", "restore", newerFile), code: exitFailed, stderr: "backup " + newerFile + " has format version 2",
			before: func(t *testing.T) {
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				var raw map[string]any
				if err := json.Unmarshal(b, &raw); err != nil {
					t.Fatal(err)
				}
				raw["format"].(map[string]any)["version"] = 2
				if err := os.WriteFile(newerFile, datastore.MustJSON(raw), 0o600); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "backup needs a file", args: withEtcd(ep, "datastore", "backup"), code: exitUsage, stderr: "datastore backup needs exactly one FILE"},
		{name: "a newer format is refused by the other commands", args: withEtcd(ep, "network", "list"), code: exitFailed, stderr: "the datastore has format version 2 (written by calico-cnm v9), but this calico-cnm only understands up to version 1",
			before: func(t *testing.T) {
				if err := store.Txn(ctx, datastore.Put(datastore.FormatKey, datastore.MustJSON(datastore.Format{Version: 2, ClusterID: f.ClusterID, WrittenBy: "v9"}))); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "and by backup", args: withEtcd(ep, "datastore", "backup", filepath.Join(dir, "x.json")), code: exitFailed, stderr: "format version 2"},
		{name: "info tells", args: withEtcd(ep, "datastore", "info"), stdout: "~format:      2 \\(this calico-cnm reads up to 1\\)(.|\n)*upgrade this calico-cnm"},
	})
	if _, err := os.Stat(filepath.Join(dir, "x.json")); !os.IsNotExist(err) {
		t.Errorf("a refused backup left a file: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}
