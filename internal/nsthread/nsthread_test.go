package nsthread_test

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/calico-cnm/calico-cnm/internal/netnstest"
	"github.com/calico-cnm/calico-cnm/internal/nsthread"
)

// TestDoRunsInsideAndLeavesTheCallerWhereItWas: fn runs in the target's
// namespace, its error comes back, and the caller's thread never moved.
func TestDoRunsInsideAndLeavesTheCallerWhereItWas(t *testing.T) {
	// Both reads of the caller's namespace are of this one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	name := netnstest.NewNamed(t, "nsthread", "running code inside another network namespace")
	target, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	own, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if own.Equal(target) {
		t.Fatal("the new namespace is the test's own")
	}

	want := errors.New("from inside")
	inTarget := false
	err = nsthread.Do(target, func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		inTarget = cur.Equal(target)
		return want
	})
	if !errors.Is(err, want) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	if !inTarget {
		t.Error("fn did not run inside the target namespace")
	}
	cur, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if !cur.Equal(own) {
		t.Error("the caller's thread is no longer in its own namespace")
	}

	if err := nsthread.Do(netns.None(), func() error { t.Error("fn ran without entering a namespace"); return nil }); err == nil {
		t.Error("Do with no namespace returned no error")
	}
}
