package ipam

import (
	"context"
	"net/netip"
	"strconv"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestCachedBlocksVoidAfterStoreWiped: once the store's revision went back
// (etcd wiped and restored), a block cached before is not used again, even
// where the restored store holds the same key at the same revision with
// other contents: the host reads the block and leaves it to its new owner.
func TestCachedBlocksVoidAfterStoreWiped(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 29)
	e := v.engine(Options{})
	first := assign(t, e, "c", "c-0") // c claims a block, cached at its revision
	blk := netip.PrefixFrom(first, 29).Masked()
	kv, err := v.m.Store.Get(context.Background(), blockKey(blk))
	if err != nil {
		t.Fatal(err)
	}

	v.m.Wipe(t)
	etcdtest.Reach(t, e.store) // e's client sees the revision go back
	fresh := New(v.m.Store, Options{Log: quietLog()})
	if _, err := fresh.AddPool(context.Background(), Pool{CIDR: "10.0.0.0/24", BlockSize: 29}); err != nil {
		t.Fatal(err)
	}
	// The same block, now host z's, written at the revision c cached.
	other := newBlock(blk, "z")
	other.allocate(0, "z-0", nil)
	for {
		rev, err := v.m.Store.Revision(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rev >= kv.ModRevision-1 {
			if rev != kv.ModRevision-1 {
				t.Fatalf("the restored store is at revision %d, past %d", rev, kv.ModRevision-1)
			}
			break
		}
		if err := v.m.Store.Txn(context.Background(), datastore.Put("filler", []byte(strconv.FormatInt(rev, 10)))); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := v.m.Store.TxnRev(context.Background(), datastore.Put(blockKey(blk), other.value()))
	if err != nil || rev != kv.ModRevision {
		t.Fatalf("block written at revision %d (%v), want %d", rev, err, kv.ModRevision)
	}

	ip := assign(t, e, "c", "c-1")
	if blk.Contains(ip) {
		t.Errorf("c assigned %s from %s, which the restored store gives to z", ip, blk)
	}
	got, err := v.m.Store.Get(context.Background(), blockKey(blk))
	if err != nil || got.ModRevision != kv.ModRevision {
		t.Errorf("z's block was written over: revision %d (%v), want %d", got.ModRevision, err, kv.ModRevision)
	}
}
