package ipam

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// commitThenTimeout is a datastore fault: while armed, the next transaction
// is applied by etcd and then reported as a timeout, the way a client sees
// a commit whose answer got lost (leader change, overloaded member). onFault
// runs just before the timeout is returned.
type commitThenTimeout struct {
	clientv3.KV
	armed atomic.Bool
	// readsDown makes every read time out (etcd unreachable).
	readsDown atomic.Bool
	mu        sync.Mutex
	onFault   func()
}

func (f *commitThenTimeout) Txn(ctx context.Context) clientv3.Txn {
	return &faultTxn{Txn: f.KV.Txn(ctx), f: f}
}

func (f *commitThenTimeout) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if f.readsDown.Load() {
		return nil, context.DeadlineExceeded
	}
	return f.KV.Get(ctx, key, opts...)
}

type faultTxn struct {
	clientv3.Txn
	f *commitThenTimeout
}

func (t *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err != nil || !t.f.armed.CompareAndSwap(true, false) {
		return resp, err
	}
	t.f.mu.Lock()
	hook := t.f.onFault
	t.f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return nil, context.DeadlineExceeded
}

// faultyStore is a store of v's etcd whose transactions can be made to time
// out after committing.
func (v *env) faultyStore() (*datastore.Store, *commitThenTimeout) {
	s := v.m.Client(v.t)
	f := &commitThenTimeout{KV: s.Client().KV}
	s.Client().KV = f
	return s, f
}

// heldBy lists the addresses held by handle, read fresh from etcd.
func (v *env) heldBy(handle string) []net.IP {
	v.t.Helper()
	ips, err := v.engine(Options{}).IPsByHandle(v.ctx, handle)
	if err != nil {
		v.t.Fatalf("IPsByHandle(%s): %v", handle, err)
	}
	return ips
}

// Issue 12 item 5: a timeout after the commit must not orphan the
// assignment. The engine reads back by handle: if the caller is still
// waiting, the committed address is the answer; if the caller gave up, the
// assignment is released.
func TestAmbiguousTimeoutAfterCommit(t *testing.T) {
	cases := []struct {
		name string
		// warm: the host already owns a block (one-transaction path);
		// otherwise the fault hits the block claim.
		warm bool
		// specific assigns 10.7.0.9 (AssignIP) instead of AutoAssign.
		specific bool
		// gaveUp: the caller's context ends with the timeout (Docker
		// stopped waiting): the assignment must be undone.
		gaveUp bool
	}{
		{name: "auto, warm block", warm: true},
		{name: "auto, block claim"},
		{name: "specific address", specific: true},
		{name: "specific address, warm block", warm: true, specific: true},
		{name: "auto, caller gave up", warm: true, gaveUp: true},
		{name: "specific, caller gave up", specific: true, gaveUp: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t, Options{})
			v.pool("10.7.0.0/16", 26)
			store, fault := v.faultyStore()
			e := New(store, Options{Log: quietLog()})
			if tc.warm {
				if _, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "warmup", Attrs: map[string]string{}}); err != nil {
					t.Fatalf("warm-up assignment: %v", err)
				}
			}
			ctx, cancel := context.WithCancel(v.ctx)
			defer cancel()
			if tc.gaveUp {
				fault.onFault = cancel
			}
			fault.armed.Store(true)
			var got net.IP
			var err error
			if tc.specific {
				got = net.ParseIP("10.7.0.9")
				err = e.AssignIP(ctx, AssignIPArgs{IP: got, Host: "h1", HandleID: "h-req"})
			} else {
				var n net.IPNet
				n, err = e.AutoAssign(ctx, AutoAssignArgs{Host: "h1", HandleID: "h-req"})
				got = n.IP
			}
			if fault.armed.Load() {
				t.Fatal("the fault never fired: the test exercised nothing")
			}
			held := v.heldBy("h-req")
			if tc.gaveUp {
				if err == nil {
					t.Fatal("the caller gave up, yet the assignment reported success")
				}
				if len(held) != 0 {
					t.Fatalf("the caller was told the assignment failed, but handle h-req still holds %v: leaked", held)
				}
				return
			}
			if err != nil {
				t.Fatalf("the assignment committed (only the answer timed out) but the caller got: %v", err)
			}
			if len(held) != 1 || !held[0].Equal(got) {
				t.Fatalf("answered %v, but handle h-req holds %v", got, held)
			}
			rep, err := v.e.Check(v.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Problems() != 0 {
				t.Fatalf("ipam check after the timeout: %+v", rep)
			}
		})
	}
}

// Issue 12 item 5, etcd gone right after the commit: the engine cannot read
// back, answers failure, and releases the assignment once etcd answers.
func TestAmbiguousTimeoutUnreadableReleasedLater(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.7.0.0/16", 26)
	store, fault := v.faultyStore()
	e := New(store, Options{Log: quietLog()})
	if _, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "warmup"}); err != nil {
		t.Fatal(err)
	}
	fault.onFault = func() { fault.readsDown.Store(true) }
	fault.armed.Store(true)
	if _, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "h-req"}); err == nil {
		t.Fatal("etcd could not be read back, yet the assignment reported success")
	}
	if held := v.heldBy("h-req"); len(held) != 1 {
		t.Fatalf("the fault should have left the committed assignment in etcd, handle holds %v", held)
	}
	fault.readsDown.Store(false)
	n, err := e.ReleaseAbandoned(v.ctx)
	if err != nil || n != 1 {
		t.Fatalf("ReleaseAbandoned = %d, %v; want 1 handle released", n, err)
	}
	if held := v.heldBy("h-req"); len(held) != 0 {
		t.Fatalf("answered failure, but h-req still holds %v after ReleaseAbandoned", held)
	}
	if held := v.heldBy("warmup"); len(held) != 1 {
		t.Fatalf("ReleaseAbandoned touched another assignment: warmup holds %v", held)
	}
}
