package ipam

import (
	"context"
	"net"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

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
			v, fault, e, warm := faultyEngine(t, tc.warm)
			ctx, cancel := context.WithCancel(v.ctx)
			defer cancel()
			var then func()
			if tc.gaveUp {
				then = cancel
			}
			fault.CommitThenTimeout(then)
			var got net.IP
			var err error
			if tc.specific {
				got = specificTarget(t, warm)
				err = e.AssignIP(ctx, AssignIPArgs{IP: got, Host: "h1", HandleID: "h-req"})
			} else {
				var n net.IPNet
				n, err = e.AutoAssign(ctx, AutoAssignArgs{Host: "h1", HandleID: "h-req"})
				got = n.IP
			}
			if !fault.Fired() {
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
	store, fault := v.m.FaultyClient(t)
	e := New(store, Options{Log: quietLog()})
	if _, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "warmup"}); err != nil {
		t.Fatal(err)
	}
	fault.CommitThenTimeout(func() { fault.SetReadsDown(true) })
	if _, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "h-req"}); err == nil {
		t.Fatal("etcd could not be read back, yet the assignment reported success")
	}
	if held := v.heldBy("h-req"); len(held) != 1 {
		t.Fatalf("the fault should have left the committed assignment in etcd, handle holds %v", held)
	}
	fault.SetReadsDown(false)
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

// A timeout whose transaction never reached etcd: the engine reads back,
// finds nothing of the request (for a block claim: no block at all) and
// answers failure, leaving nothing behind; the next request works. The
// claim case panicked once (the read-back's missing block was looked into).
func TestAmbiguousTimeoutNotCommitted(t *testing.T) {
	cases := []struct {
		name     string
		warm     bool // the host already owns a block
		specific bool // AssignIP of 10.7.0.9 instead of AutoAssign
	}{
		{name: "auto, warm block", warm: true},
		{name: "auto, block claim"},
		{name: "specific address, block claim", specific: true},
		{name: "specific address, warm block", warm: true, specific: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, fault, e, warm := faultyEngine(t, tc.warm)
			target := specificTarget(t, warm)
			assign := func(handle string) error {
				if tc.specific {
					return e.AssignIP(v.ctx, AssignIPArgs{IP: target, Host: "h1", HandleID: handle})
				}
				_, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: handle})
				return err
			}
			fault.TimeoutWithoutCommit(nil)
			err := assign("h-lost")
			if !fault.Fired() {
				t.Fatal("the fault never fired: the test exercised nothing")
			}
			if err == nil {
				t.Fatal("the transaction never reached etcd, yet the assignment reported success")
			}
			if held := v.heldBy("h-lost"); len(held) != 0 {
				t.Fatalf("the assignment never committed, but handle h-lost holds %v", held)
			}
			if err := assign("h-next"); err != nil {
				t.Fatalf("the assignment after the lost one: %v", err)
			}
			if held := v.heldBy("h-next"); len(held) != 1 {
				t.Fatalf("handle h-next holds %v, want one address", held)
			}
			rep, err := v.e.Check(v.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Problems() != 0 {
				t.Fatalf("ipam check after the lost transaction: %+v", rep)
			}
		})
	}
}

// faultyEngine is an engine on a pool 10.7.0.0/16 whose etcd client takes
// faults; with warm, host h1 already holds an address (warm) of a block it
// owns, so that a fault hits a write to that block rather than a claim.
func faultyEngine(t *testing.T, warm bool) (*env, *etcdtest.Faults, *Engine, net.IP) {
	t.Helper()
	v := newEnv(t, Options{})
	v.pool("10.7.0.0/16", 26)
	store, fault := v.m.FaultyClient(t)
	e := New(store, Options{Log: quietLog()})
	if !warm {
		return v, fault, e, nil
	}
	n, err := e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "warmup"})
	if err != nil {
		t.Fatalf("warm-up assignment: %v", err)
	}
	return v, fault, e, n.IP
}

// specificTarget is the address the specific cases assign: 10.7.0.9, in a
// block nobody has claimed, or with a warm-up assignment an address of the
// warm-up's block, so that the fault hits a write to an existing block.
func specificTarget(t *testing.T, warm net.IP) net.IP {
	t.Helper()
	if warm == nil {
		return net.ParseIP("10.7.0.9")
	}
	w := mustAddr(t, warm)
	target := w.Next().Next()
	if blockOf(target, 26) != blockOf(w, 26) {
		t.Fatalf("%s is not in the warm-up block of %s", target, w)
	}
	return net.IP(target.AsSlice())
}
