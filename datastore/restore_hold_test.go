package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestRestoreHoldsAssignmentsUntilEveryNodeReconciled: a restore leaves a
// hold naming the nodes of the backup and of the datastore it replaced;
// each node's release (guarded by the format record's revision) takes it
// off, and the last one ends the hold.
func TestRestoreHoldsAssignmentsUntilEveryNodeReconciled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := etcdtest.Start(t).Store
	if _, err := s.EnsureFormat(ctx, "", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Txn(ctx, datastore.Put(datastore.NodeKey("h1"), []byte(`{}`)), datastore.Put(datastore.EndpointKey("h2", "e1"), []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	b, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A node that joined after the backup reconciles too.
	if err := s.Txn(ctx, datastore.Put(datastore.EndpointKey("h3", "e2"), []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckRestoreHold(ctx); err != nil {
		t.Fatalf("a hold before any restore: %v", err)
	}
	if _, err := s.Restore(ctx, b, "v1"); err != nil {
		t.Fatal(err)
	}
	f, rev, err := s.ReadFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.Restore == nil || !f.Restore.Complete || !reflect.DeepEqual(f.Restore.Pending, []string{"h1", "h2", "h3"}) {
		t.Fatalf("hold after the restore: %+v; want complete, pending h1 h2 h3", f.Restore)
	}
	if err := s.CheckRestoreHold(ctx); !errors.Is(err, datastore.ErrRestoreInProgress) {
		t.Fatalf("CheckRestoreHold after a restore: %v; want ErrRestoreInProgress", err)
	}
	if err := s.ReleaseRestoreHold(ctx, "h1", f, rev); err != nil {
		t.Fatal(err)
	}
	// A release from a pass that read the record before h1's is dropped.
	if err := s.ReleaseRestoreHold(ctx, "h2", f, rev); err != nil {
		t.Fatal(err)
	}
	if f, rev, err = s.ReadFormat(ctx); err != nil || !reflect.DeepEqual(f.Restore.Pending, []string{"h2", "h3"}) {
		t.Fatalf("hold after h1's and a stale release: %+v, %v; want h2 h3 pending", f.Restore, err)
	}
	for _, n := range []string{"h2", "h3"} {
		if err := s.ReleaseRestoreHold(ctx, n, f, rev); err != nil {
			t.Fatal(err)
		}
		if f, rev, err = s.ReadFormat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.Restore != nil {
		t.Fatalf("hold after every node reconciled: %+v", f.Restore)
	}
	if err := s.CheckRestoreHold(ctx); err != nil {
		t.Fatalf("CheckRestoreHold after every release: %v", err)
	}
}

func TestRestoreHoldHolding(t *testing.T) {
	since := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name          string
		hold          *datastore.RestoreHold
		at            time.Time
		holding, wait bool
	}{
		{"none", nil, since, false, false},
		{"records being written", &datastore.RestoreHold{Since: since, Pending: []string{"h1"}}, since, true, false},
		{"pending", &datastore.RestoreHold{Since: since, Complete: true, Pending: []string{"h1"}}, since.Add(time.Minute), true, true},
		{"other node pending", &datastore.RestoreHold{Since: since, Complete: true, Pending: []string{"h2"}}, since, true, false},
		{"all reconciled", &datastore.RestoreHold{Since: since, Complete: true}, since, false, false},
		{"lapsed", &datastore.RestoreHold{Since: since, Complete: true, Pending: []string{"h1"}}, since.Add(datastore.RestoreHoldMax), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.hold.Holding(tc.at); got != tc.holding {
				t.Errorf("Holding = %v; want %v", got, tc.holding)
			}
			if got := tc.hold.Waits("h1", tc.at); got != tc.wait {
				t.Errorf("Waits(h1) = %v; want %v", got, tc.wait)
			}
		})
	}
}

// TestRestoreTransactions: a restore that fits etcd's --max-txn-ops is
// one transaction (all or nothing); a larger one is written in batches
// after the hold, and ends complete.
func TestRestoreTransactions(t *testing.T) {
	for _, tc := range []struct {
		records int
		maxTxns int64
		minTxns int64
	}{
		{records: 100, minTxns: 1, maxTxns: 1},
		{records: 300, minTxns: 4, maxTxns: 5}, // hold, 3 batches, format
	} {
		t.Run(fmt.Sprint(tc.records), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s := etcdtest.Start(t).Store
			b := datastore.Backup{Kind: datastore.BackupKind, Format: datastore.Format{Version: 1, ClusterID: "c1"}}
			for i := range tc.records {
				b.Records = append(b.Records, datastore.Record{Key: datastore.EndpointKey("h1", fmt.Sprintf("e%03d", i)), Value: []byte(`{}`)})
			}
			before := s.Stats().Txns
			rep, err := s.Restore(ctx, b, "v1")
			if err != nil {
				t.Fatal(err)
			}
			// EnsureFormat after the records finds the format current.
			if n := s.Stats().Txns - before; n < tc.minTxns || n > tc.maxTxns {
				t.Errorf("restore of %d records took %d transactions; want %d..%d", tc.records, n, tc.minTxns, tc.maxTxns)
			}
			kvs, err := s.List(ctx, datastore.EndpointsPrefix)
			if err != nil || len(kvs) != tc.records || rep.Written != tc.records {
				t.Fatalf("after the restore: %d records, %v, report %+v; want %d", len(kvs), err, rep, tc.records)
			}
			f, _, err := s.ReadFormat(ctx)
			if err != nil || f.Restore == nil || !f.Restore.Complete || f.ClusterID != "c1" {
				t.Fatalf("format after the restore: %+v, %v; want cluster c1, a complete hold", f, err)
			}
		})
	}
}

// TestRestoreGateChecksTheHoldInTheTransaction: the gate reads the format
// record once; later admissions read nothing, and a restore written after
// that read fails the assignment's own transaction. Forgotten, the gate
// reads the hold and refuses until it is released.
func TestRestoreGateChecksTheHoldInTheTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := etcdtest.Start(t).Store
	if _, err := s.EnsureFormat(ctx, "", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Txn(ctx, datastore.Put(datastore.NodeKey("h1"), []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	g := s.RestoreGate(0)
	ops, err := g.Admit(ctx)
	if err != nil || len(ops) == 0 {
		t.Fatalf("Admit without a hold: %v, %d ops; want a check", err, len(ops))
	}
	reads := s.Stats().Reads
	for i := range 5 {
		if ops, err = g.Admit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Txn(ctx, append(ops, datastore.Put(fmt.Sprintf("assigned/%d", i), []byte("x")))...); err != nil {
			t.Fatalf("assignment %d under the gate: %v", i, err)
		}
	}
	if got := s.Stats().Reads - reads; got != 0 {
		t.Fatalf("5 admissions read the datastore %d times, want 0", got)
	}
	b, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore(ctx, b, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Txn(ctx, append(ops, datastore.Put("assigned/late", []byte("x")))...); !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("an assignment admitted before the restore, committed after it: %v; want ErrConflict", err)
	}
	if _, err := s.Get(ctx, "assigned/late"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("the refused transaction wrote: %v", err)
	}
	if _, err := g.Admit(ctx); err != nil {
		t.Fatalf("Admit before Forget answers its remembered check: %v", err)
	}
	g.Forget()
	if _, err := g.Admit(ctx); !errors.Is(err, datastore.ErrRestoreInProgress) {
		t.Fatalf("Admit during the hold: %v; want ErrRestoreInProgress", err)
	}
	f, rev, err := s.ReadFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseRestoreHold(ctx, "h1", f, rev); err != nil {
		t.Fatal(err)
	}
	if ops, err = g.Admit(ctx); err != nil {
		t.Fatalf("Admit after the hold ended: %v", err)
	}
	if err := s.Txn(ctx, append(ops, datastore.Put("assigned/after", []byte("x")))...); err != nil {
		t.Fatalf("an assignment after the hold: %v", err)
	}
}

// TestRestoreGateWithoutFormatRecord: with no format record the check is
// that there still is none (a restore creates one, holding).
func TestRestoreGateWithoutFormatRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := etcdtest.Start(t).Store
	ops, err := s.RestoreGate(0).Admit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Txn(ctx, ops...); err != nil {
		t.Fatalf("check with no record: %v", err)
	}
	if _, err := s.EnsureFormat(ctx, "", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Txn(ctx, ops...); !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("check after the record appeared: %v; want ErrConflict", err)
	}
}
