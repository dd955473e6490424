package api

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

func TestStoreApplyGetDelete(t *testing.T) {
	s := etcdtest.Start(t).Store
	ctx := context.Background()
	ps, err := Decode(strings.NewReader(head + "---\n" + strings.Replace(head, "name: p", "name: q", 1) + "spec: {order: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Apply(ctx, s, ps)
	if err != nil || len(res) != 2 || !res[0].Created || !res[1].Created {
		t.Fatalf("apply: %v %+v", err, res)
	}
	res, err = Apply(ctx, s, ps[:1])
	if err != nil || res[0].Created {
		t.Fatalf("re-apply should replace: %v %+v", err, res)
	}
	got, bad, err := ListPolicies(ctx, s)
	if err != nil || len(bad) != 0 || len(got) != 2 || got[0].Metadata.Name != "q" {
		t.Fatalf("list: %v %v %+v", err, bad, got)
	}
	// A bad record is reported and skipped, never fatal.
	if err := s.Txn(ctx, datastore.Put(PolicyKey("broken"), []byte(`{"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy","metadata":{"name":"broken"},"spec":{"selector":"=="}}`))); err != nil {
		t.Fatal(err)
	}
	got, bad, err = ListPolicies(ctx, s)
	if err != nil || len(got) != 2 || len(bad) != 1 || !strings.Contains(bad[0].Error(), "spec.selector") {
		t.Fatalf("list with a bad record: %v %v %d", err, bad, len(got))
	}
	if _, err := Get(ctx, s, "broken"); err == nil {
		t.Error("Get of an invalid record succeeded")
	}
	if err := Delete(ctx, s, "p"); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, s, "p"); !errors.Is(err, ErrPolicyNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := Get(ctx, s, "p"); !errors.Is(err, ErrPolicyNotFound) {
		t.Errorf("get deleted: %v", err)
	}
}
