package etcdtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Faults is a datastore fault injector over one client's etcd KV. Armed,
// the next transaction is reported as a timeout, either after etcd applied
// it (CommitThenTimeout: the commit's answer was lost) or without sending
// it (TimeoutWithoutCommit: the request was lost): a client cannot tell the
// two apart, as after a leader change or with an overloaded member. With
// ReadsDown, every read times out; with FailReads, every read fails with a
// given error.
type Faults struct {
	clientv3.KV
	armed   atomic.Bool
	mu      sync.Mutex
	onFault func()
	commit  bool  // guarded by mu: the armed fault lets etcd apply the transaction
	readErr error // guarded by mu; nil: reads reach etcd
}

// FaultyClient is Client with a fault injector between the store and etcd.
func (m *Member) FaultyClient(t testing.TB) (*datastore.Store, *Faults) {
	t.Helper()
	s := m.Client(t)
	f := &Faults{KV: s.Client().KV}
	s.Client().KV = f
	return s, f
}

// CommitThenTimeout arms the fault for the next transaction; then, if not
// nil, runs just before the timeout is returned.
func (f *Faults) CommitThenTimeout(then func()) { f.arm(true, then) }

// TimeoutWithoutCommit arms the fault for the next transaction, which etcd
// never sees; then, if not nil, runs just before the timeout is returned.
func (f *Faults) TimeoutWithoutCommit(then func()) { f.arm(false, then) }

func (f *Faults) arm(commit bool, then func()) {
	f.mu.Lock()
	f.onFault = then
	f.commit = commit
	f.mu.Unlock()
	f.armed.Store(true)
}

// Fired tells whether the armed fault has hit a transaction.
func (f *Faults) Fired() bool { return !f.armed.Load() }

// SetReadsDown makes every read time out (true) or work again (false).
func (f *Faults) SetReadsDown(down bool) {
	var err error
	if down {
		err = context.DeadlineExceeded
	}
	f.FailReads(err)
}

// FailReads makes every read fail with err, as the etcd client would
// return it; nil makes reads work again.
func (f *Faults) FailReads(err error) {
	f.mu.Lock()
	f.readErr = err
	f.mu.Unlock()
}

// Get fails while reads are down.
func (f *Faults) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	f.mu.Lock()
	err := f.readErr
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.KV.Get(ctx, key, opts...)
}

// Txn wraps the transaction so that an armed fault hits its commit.
func (f *Faults) Txn(ctx context.Context) clientv3.Txn {
	return &faultTxn{Txn: f.KV.Txn(ctx), f: f}
}

type faultTxn struct {
	clientv3.Txn
	f *Faults
}

func (t *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	t.f.mu.Lock()
	lose := !t.f.commit
	t.f.mu.Unlock()
	if lose && t.f.armed.CompareAndSwap(true, false) {
		return t.f.fire()
	}
	resp, err := t.Txn.Commit()
	if err != nil || lose || !t.f.armed.CompareAndSwap(true, false) {
		return resp, err
	}
	return t.f.fire()
}

// fire runs the armed fault's hook and answers the timeout.
func (f *Faults) fire() (*clientv3.TxnResponse, error) {
	f.mu.Lock()
	then := f.onFault
	f.mu.Unlock()
	if then != nil {
		then()
	}
	return nil, context.DeadlineExceeded
}
