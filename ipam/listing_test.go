package ipam

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// blockReads counts the block records (with their values) a client's
// reads return, whether by a listing or by a transaction of reads.
type blockReads struct {
	clientv3.KV
	n atomic.Int64
}

func (c *blockReads) count(kvs []*mvccpb.KeyValue) {
	for _, kv := range kvs {
		if strings.Contains(string(kv.Key), blocksPrefix) && len(kv.Value) > 0 {
			c.n.Add(1)
		}
	}
}

func (c *blockReads) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	r, err := c.KV.Get(ctx, key, opts...)
	if err == nil {
		c.count(r.Kvs)
	}
	return r, err
}

func (c *blockReads) Txn(ctx context.Context) clientv3.Txn {
	return &countedTxn{Txn: c.KV.Txn(ctx), c: c}
}

type countedTxn struct {
	clientv3.Txn
	c *blockReads
}

func (t *countedTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *countedTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *countedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *countedTxn) Commit() (*clientv3.TxnResponse, error) {
	r, err := t.Txn.Commit()
	if err == nil {
		for _, op := range r.Responses {
			t.c.count(op.GetResponseRange().GetKvs())
		}
	}
	return r, err
}

// TestColdClaimReadsOnlyChangedBlocks: a host that runs out of room lists
// the cluster's blocks, but reads again only the records that changed since
// its last listing: none of another host's full blocks, one new block of
// it, and none of its own (cached) blocks. Each claim still finds a free
// block, and the addresses stay distinct.
func TestColdClaimReadsOnlyChangedBlocks(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 29) // blocks of 8 addresses
	a := v.engine(Options{})
	client := v.m.Client(t)
	reads := &blockReads{KV: client.Client().KV}
	client.Client().KV = reads
	b := New(client, Options{Log: quietLog()})

	seen := map[netip.Addr]string{}
	take := func(e *Engine, host string, n int) {
		t.Helper()
		for range n {
			handle := host + "-" + strconv.Itoa(len(seen))
			ip := assign(t, e, host, handle)
			if other, dup := seen[ip]; dup {
				t.Fatalf("%s assigned to %s and %s", ip, other, handle)
			}
			seen[ip] = handle
		}
	}
	coldClaim := func(want int64, what string) {
		t.Helper()
		reads.n.Store(0)
		take(b, "b", 1)
		if got := reads.n.Load(); got != want {
			t.Errorf("%s: host b read %d block records, want %d", what, got, want)
		}
	}

	take(a, "a", 5*8) // five full blocks
	coldClaim(5, "first claim: every block is new to host b")
	take(b, "b", 7) // b's block full
	coldClaim(0, "second claim: nothing changed but b's own blocks, which it holds")
	take(a, "a", 1) // a claims a sixth block
	take(b, "b", 7)
	coldClaim(1, "third claim: a's new block")
	if got := len(hostBlocks(t, b, "b")); got != 3 {
		t.Errorf("host b owns %d blocks after three claims, want 3", got)
	}

	// One engine serving two hosts: what one host's listing learnt of the
	// other's blocks must not stand in for that host's own blocks, which
	// it assigns from.
	take(a, "c", 8) // c's first block, full
	take(a, "a", 7) // fills a's sixth block
	// Another process frees an address of a's: a's cached copy of that
	// block is behind, and c's next listing reads the block as it is now.
	var freed netip.Addr
	for ip, handle := range seen {
		if strings.HasPrefix(handle, "a-") {
			freed = ip
			break
		}
	}
	if err := v.e.ReleaseIP(context.Background(), freed.AsSlice()); err != nil {
		t.Fatal(err)
	}
	delete(seen, freed)
	take(a, "c", 1) // c claims its second block
	if ip := assign(t, a, "a", "a-again"); ip != freed {
		t.Errorf("host a assigned %s, want %s, freed in its own block", ip, freed)
	}
	for host, want := range map[string]int{"a": 6, "c": 2} {
		if got := len(hostBlocks(t, a, host)); got != want {
			t.Errorf("host %s owns %d blocks, want %d", host, got, want)
		}
	}
}

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
