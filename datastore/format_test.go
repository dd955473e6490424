package datastore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

func TestEnsureFormatRecordsUnversionedDataAsCurrent(t *testing.T) {
	s := etcdtest.Start(t).Store
	ctx := context.Background()
	// Data written before the format was recorded: no format record.
	if err := s.Txn(ctx, datastore.Create(datastore.NetworkKey("n1"), []byte(`{"id":"n1"}`))); err != nil {
		t.Fatal(err)
	}
	f, rev, err := s.ReadFormat(ctx)
	if err != nil || rev != 0 || f.Version != 1 {
		t.Fatalf("ReadFormat of unversioned data = %+v rev %d, %v; want implied version 1, no record", f, rev, err)
	}
	got, err := s.EnsureFormat(ctx, "", "v-test")
	if err != nil {
		t.Fatalf("EnsureFormat: %v", err)
	}
	if got.Version != datastore.CurrentFormat || got.ClusterID == "" || got.WrittenBy != "v-test" {
		t.Fatalf("EnsureFormat wrote %+v; want version %d, a cluster id, writtenBy v-test", got, datastore.CurrentFormat)
	}
	// A second daemon keeps the identity the first one wrote, whatever
	// it remembers.
	again, err := etcdtest.Start(t).Store.EnsureFormat(ctx, "", "x") // another cluster entirely
	if err != nil || again.ClusterID == got.ClusterID {
		t.Fatalf("a fresh datastore got cluster id %q (%v); want a new one, not %q", again.ClusterID, err, got.ClusterID)
	}
	second, err := s.EnsureFormat(ctx, "remembered-elsewhere", "v-test-2")
	if err != nil || second.ClusterID != got.ClusterID {
		t.Fatalf("EnsureFormat on a versioned datastore = %+v, %v; want cluster id %s kept", second, err, got.ClusterID)
	}
	if _, err := s.Get(ctx, datastore.NetworkKey("n1")); err != nil {
		t.Fatalf("the unversioned data must be left as it is: %v", err)
	}
}

func TestEnsureFormatTakesTheRememberedClusterID(t *testing.T) {
	s := etcdtest.Start(t).Store
	f, err := s.EnsureFormat(context.Background(), "abc123", "v")
	if err != nil || f.ClusterID != "abc123" {
		t.Fatalf("EnsureFormat(remembered abc123) = %+v, %v", f, err)
	}
}

func TestEnsureFormatUpgradesStepByStep(t *testing.T) {
	s := etcdtest.Start(t).Store
	ctx := context.Background()
	if _, err := s.EnsureFormat(ctx, "c1", "old"); err != nil {
		t.Fatal(err)
	}
	var ran []int
	step := func(from int) datastore.FormatUpgrade {
		return datastore.FormatUpgrade{From: from, Run: func(ctx context.Context, s *datastore.Store) error {
			ran = append(ran, from)
			return s.Txn(ctx, datastore.Put("upgraded-from-"+string(rune('0'+from)), []byte("1")))
		}}
	}
	// A build two formats ahead, with its steps out of order.
	f, err := datastore.EnsureFormatWith(s, ctx, 3, []datastore.FormatUpgrade{step(2), step(1)}, "", "new")
	if err != nil {
		t.Fatalf("upgrade 1 -> 3: %v", err)
	}
	if f.Version != 3 || f.ClusterID != "c1" || len(ran) != 2 || ran[0] != 1 || ran[1] != 2 {
		t.Fatalf("upgrade wrote %+v after steps %v; want version 3, cluster c1, steps [1 2]", f, ran)
	}
	for _, k := range []string{"upgraded-from-1", "upgraded-from-2"} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Fatalf("step's record %s: %v", k, err)
		}
	}
	// A build with a gap in its steps refuses rather than half-upgrade.
	other := etcdtest.Start(t).Store
	if _, err := other.EnsureFormat(ctx, "", "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := datastore.EnsureFormatWith(other, ctx, 3, []datastore.FormatUpgrade{step(2)}, "", "new"); err == nil || !strings.Contains(err.Error(), "no upgrade from datastore format 1 to 2") {
		t.Fatalf("missing step: want a clear error, got %v", err)
	}
	if f, _, _ := other.ReadFormat(ctx); f.Version != 1 {
		t.Fatalf("a refused upgrade changed the format record to %+v", f)
	}
}

func TestOlderBuildRefusesNewerFormat(t *testing.T) {
	s := etcdtest.Start(t).Store
	ctx := context.Background()
	newer := datastore.CurrentFormat + 1
	if _, err := datastore.EnsureFormatWith(s, ctx, newer, []datastore.FormatUpgrade{{From: datastore.CurrentFormat, Run: func(context.Context, *datastore.Store) error { return nil }}}, "", "v9.9"); err != nil {
		t.Fatal(err)
	}
	for name, check := range map[string]func() error{
		"daemon (EnsureFormat)": func() error { _, err := s.EnsureFormat(ctx, "", "v1"); return err },
		"CLI (CheckFormat)":     func() error { return s.CheckFormat(ctx) },
		"backup (Export)":       func() error { _, err := s.Export(ctx); return err },
	} {
		err := check()
		if !errors.Is(err, datastore.ErrFormatTooNew) {
			t.Errorf("%s on a newer format: want ErrFormatTooNew, got %v", name, err)
			continue
		}
		for _, want := range []string{"format version 2", "v9.9", "only understands up to version 1", "upgrade this calico-cnm"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", name, err, want)
			}
		}
	}
	if f, _, _ := s.ReadFormat(ctx); f.Version != newer {
		t.Fatalf("the older build rewrote the newer format record: %+v", f)
	}
}
