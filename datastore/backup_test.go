package datastore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// roundTrip encodes a backup as the CLI writes it and reads it back.
func roundTrip(t *testing.T, b datastore.Backup) datastore.Backup {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(b); err != nil {
		t.Fatal(err)
	}
	got, err := datastore.ReadBackup(&buf, "test.json")
	if err != nil {
		t.Fatalf("ReadBackup: %v", err)
	}
	return got
}

func TestBackupRestoreBringsBackTheRecordsAndKeepsLiveness(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store
	ctx := context.Background()
	f, err := s.EnsureFormat(ctx, "", "v1")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		datastore.NetworkKey("n1"):           `{"id":"n1"}`,
		datastore.EndpointKey("host1", "e1"): `{"id":"e1","ipv4":"10.0.0.1/32"}`,
		"opaque":                             "not json \x00",
	} {
		if err := s.Txn(ctx, datastore.Put(k, []byte(v))); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := s.ClaimAlive(ctx, datastore.LocalAlive("host1", ""), 10*time.Second, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	_ = lease
	b, err := s.Export(ctx)
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	if b.Format.ClusterID != f.ClusterID || b.Format.Version != datastore.CurrentFormat || len(b.Records) != 3 {
		t.Fatalf("backup = format %+v, %d records; want cluster %s, 3 records (no liveness key, no format record)", b.Format, len(b.Records), f.ClusterID)
	}
	b = roundTrip(t, b)

	// After the backup: one record changes, one is added, one goes.
	if err := s.Txn(ctx, datastore.Put(datastore.NetworkKey("n1"), []byte(`{"id":"n1","name":"changed"}`)),
		datastore.Put(datastore.NetworkKey("n2"), []byte(`{"id":"n2"}`)),
		datastore.Delete(datastore.EndpointKey("host1", "e1"), 0)); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Restore(ctx, b, "v1")
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if rep.Written != 2 || rep.Deleted != 1 || rep.Unchanged != 1 {
		t.Fatalf("Restore report %+v; want 2 written (n1, e1), 1 deleted (n2), 1 unchanged (opaque)", rep)
	}
	want := map[string]string{
		datastore.NetworkKey("n1"):           `{"id":"n1"}`,
		datastore.EndpointKey("host1", "e1"): `{"id":"e1","ipv4":"10.0.0.1/32"}`,
		"opaque":                             "not json \x00",
	}
	for k, v := range want {
		kv, err := s.Get(ctx, k)
		if err != nil || string(kv.Value) != v {
			t.Errorf("%s after restore = %q, %v; want %q", k, kv.Value, err, v)
		}
	}
	if _, err := s.Get(ctx, datastore.NetworkKey("n2")); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("n2, created after the backup, survived the restore: %v", err)
	}
	alive, err := s.AliveNodes(ctx)
	if err != nil || len(alive) != 1 {
		t.Fatalf("the running daemon's liveness key must survive a restore: %v, %v", alive, err)
	}
	if got, _, _ := s.ReadFormat(ctx); got.ClusterID != f.ClusterID {
		t.Fatalf("format after restore %+v; want cluster %s", got, f.ClusterID)
	}
}

// sourceBackup is the backup of a versioned datastore holding network n1.
func sourceBackup(t *testing.T) (datastore.Format, datastore.Backup) {
	t.Helper()
	ctx := context.Background()
	src := etcdtest.Start(t).Store
	f, err := src.EnsureFormat(ctx, "", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Txn(ctx, datastore.Put(datastore.NetworkKey("n1"), []byte(`{"id":"n1"}`))); err != nil {
		t.Fatal(err)
	}
	b, err := src.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return f, b
}

func TestRestoreIntoLostDatastore(t *testing.T) {
	ctx := context.Background()
	f, b := sourceBackup(t)
	for name, prepare := range map[string]func(*datastore.Store) error{
		// External members wiped: nothing at all.
		"empty": func(*datastore.Store) error { return nil },
		// Embedded etcd removed and the daemon restarted: it wrote the
		// cluster id it remembers.
		"daemon remembered the cluster": func(s *datastore.Store) error {
			_, err := s.EnsureFormat(ctx, f.ClusterID, "v1")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			dst := etcdtest.Start(t).Store
			if err := prepare(dst); err != nil {
				t.Fatal(err)
			}
			if _, err := dst.Restore(ctx, roundTrip(t, b), "v1"); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if _, err := dst.Get(ctx, datastore.NetworkKey("n1")); err != nil {
				t.Fatalf("n1 not restored: %v", err)
			}
			if got, _, _ := dst.ReadFormat(ctx); got.ClusterID != f.ClusterID || got.Version != datastore.CurrentFormat {
				t.Fatalf("format after restore = %+v; want cluster %s", got, f.ClusterID)
			}
		})
	}
}

func TestRestoreRefuses(t *testing.T) {
	ctx := context.Background()
	_, b := sourceBackup(t)
	dst := etcdtest.Start(t).Store
	dstFormat, err := dst.EnsureFormat(ctx, "", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Txn(ctx, datastore.Put(datastore.NetworkKey("mine"), []byte(`{"id":"mine"}`))); err != nil {
		t.Fatal(err)
	}
	_, err = dst.Restore(ctx, b, "v1")
	if !errors.Is(err, datastore.ErrOtherCluster) || !strings.Contains(err.Error(), b.Format.ClusterID) || !strings.Contains(err.Error(), dstFormat.ClusterID) {
		t.Fatalf("restore into another cluster: want ErrOtherCluster naming both ids, got %v", err)
	}
	if _, err := dst.Get(ctx, datastore.NetworkKey("mine")); err != nil {
		t.Fatalf("a refused restore changed the datastore: %v", err)
	}

	// A file from a newer calico-cnm is refused as it is read.
	newer := b
	newer.Format.Version = datastore.CurrentFormat + 1
	newer.Format.WrittenBy = "v9"
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(newer); err != nil {
		t.Fatal(err)
	}
	if _, err := datastore.ReadBackup(&buf, "new.json"); !errors.Is(err, datastore.ErrFormatTooNew) || !strings.Contains(err.Error(), "backup new.json") {
		t.Fatalf("ReadBackup of a newer format: want ErrFormatTooNew naming the file, got %v", err)
	}
	if _, err := dst.Restore(ctx, newer, "v1"); !errors.Is(err, datastore.ErrFormatTooNew) {
		t.Fatalf("Restore of a newer format: want ErrFormatTooNew, got %v", err)
	}
	if _, err := datastore.ReadBackup(strings.NewReader(`{"kind":"something-else"}`), "x.json"); !errors.Is(err, datastore.ErrNotABackup) {
		t.Fatalf("ReadBackup of another file: want ErrNotABackup, got %v", err)
	}
}
