package ipam_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// TestAssignAfterDatastoreWipedAndRestored: the engine keeps serving when
// its etcd is replaced by an empty member (same URL) and a backup restored
// into it. The restored records have lower revisions than the engine's
// cached copies; a cache that only moved forward would conflict for ever.
func TestAssignAfterDatastoreWipedAndRestored(t *testing.T) {
	ctx := context.Background()
	m := etcdtest.Start(t)
	client := m.Client(t)
	eng := ipam.New(client, ipam.Options{Log: logrus.New()})
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.30.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	first, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: "cnm.1", Attrs: map[string]string{ipam.AttrNode: "h1"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Push the revision well above what the new member will reach.
	for i := range 50 {
		if err := client.Txn(ctx, datastore.Put(fmt.Sprintf("filler/%d", i), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	second, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: "cnm.2", Attrs: map[string]string{ipam.AttrNode: "h1"}})
	if err != nil {
		t.Fatal(err)
	}

	// The member is lost and replaced by an empty one at the same URL.
	if err := m.Store.Close(); err != nil {
		t.Logf("closing the first member: %v", err)
	}
	cfg := m.Config
	cfg.DataDir = t.TempDir()
	octx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	fresh, err := datastore.Open(octx, cfg, nil)
	if err != nil {
		t.Fatalf("starting the replacement member: %v", err)
	}
	t.Cleanup(func() { _ = fresh.Close() })
	if _, err := fresh.Restore(ctx, b, "test"); err != nil {
		t.Fatalf("restore: %v", err)
	}

	// The second address is not in the backup: a new assignment may get
	// it (reconcile keeps live ones, see the plugin's tests), but never
	// the first one, and it must succeed.
	third := ipam.AutoAssignArgs{Host: "h1", HandleID: "cnm.3", Attrs: map[string]string{ipam.AttrNode: "h1"}}
	var got string
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := eng.AutoAssign(ctx, third)
		if err == nil {
			got = n.IP.String()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("assigning after the wipe and restore: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // the client reconnecting to the new member
	}
	if got == first.IP.String() {
		t.Fatalf("the restored assignment %s was handed out again", got)
	}
	t.Logf("first %s (restored), second %s (lost with the wipe), third %s", first.IP, second.IP, got)
}

// TestGuardedGateReadsNothingPerAssignment: behind the daemon's restore
// gate, warm assignments are one transaction and no read, and a restore
// hold written after the gate last read the format record still stops
// the next assignment (its transaction checks the record).
func TestGuardedGateReadsNothingPerAssignment(t *testing.T) {
	ctx := context.Background()
	m := etcdtest.Start(t)
	client := m.Client(t)
	if _, err := client.EnsureFormat(ctx, "", "test"); err != nil {
		t.Fatal(err)
	}
	eng := ipam.New(client, ipam.Options{Log: logrus.New(), GuardedGate: client.RestoreGate(0)})
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.31.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	assign := func(handle string) error {
		_, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "h1", HandleID: handle})
		return err
	}
	if err := assign("cnm.first"); err != nil {
		t.Fatal(err)
	}
	before := client.Stats()
	for i := range 10 {
		if err := assign(fmt.Sprintf("cnm.%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	after := client.Stats()
	if txns, reads := after.Txns-before.Txns, after.Reads-before.Reads; txns != 10 || reads != 0 {
		t.Fatalf("10 gated warm assignments: %d transactions, %d reads; want 10 and 0", txns, reads)
	}

	// A restore's hold, written behind the gate's back.
	f, rev, err := client.ReadFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := f
	held.Restore = &datastore.RestoreHold{Since: time.Now(), Complete: true, Pending: []string{"h2"}}
	if err := client.Txn(ctx, datastore.Write(datastore.FormatKey, datastore.MustJSON(held), rev)); err != nil {
		t.Fatal(err)
	}
	if err := assign("cnm.held"); !errors.Is(err, datastore.ErrRestoreInProgress) {
		t.Fatalf("AutoAssign during a restore hold: %v; want ErrRestoreInProgress", err)
	}
	as, err := eng.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.HandleID == "cnm.held" {
			t.Fatalf("an address was assigned during the hold: %+v", a)
		}
	}
	f, rev, err = client.ReadFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.ReleaseRestoreHold(ctx, "h2", f, rev); err != nil {
		t.Fatal(err)
	}
	if err := assign("cnm.after"); err != nil {
		t.Fatalf("AutoAssign after the hold ended: %v", err)
	}
}
