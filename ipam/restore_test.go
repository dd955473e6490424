package ipam_test

import (
	"context"
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
