package datastore_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKeepAlive: a daemon's liveness key exists while it runs, a second
// daemon with the same node name is told someone else holds it (and takes
// over once the first stops), and a clean stop removes the key at once.
func TestKeepAlive(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	waitFor := func(what string, cond func(map[string]datastore.Alive) bool) map[string]datastore.Alive {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			alive, err := m.Store.AliveNodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if cond(alive) {
				return alive
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: alive nodes %v", what, alive)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	run := func(a datastore.Alive, log logrus.FieldLogger) (stop func()) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			m.Store.KeepAlive(cctx, a, 3*time.Second, log)
		}()
		return func() { cancel(); <-done }
	}

	quiet := logrus.New()
	quiet.SetOutput(&syncBuffer{})
	stopFirst := run(datastore.Alive{Node: "n1", Hostname: "h1", PID: 101, Since: time.Now().UTC()}, quiet)
	alive := waitFor("first daemon marked alive", func(a map[string]datastore.Alive) bool { return a["n1"].PID == 101 })
	if alive["n1"].Hostname != "h1" {
		t.Errorf("liveness value = %+v", alive["n1"])
	}

	// A second daemon claiming the same node name.
	var logs syncBuffer
	second := logrus.New()
	second.SetOutput(&logs)
	stopSecond := run(datastore.Alive{Node: "n1", Hostname: "h2", PID: 202, Since: time.Now().UTC()}, second)
	defer stopSecond()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "is held by another live daemon: pid 101 on host h1") {
		if time.Now().After(deadline) {
			t.Fatalf("the second daemon did not report the first one; its log:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, _ := m.Store.AliveNodes(ctx); got["n1"].PID != 101 {
		t.Errorf("the second daemon took the key while the first holds it: %+v", got["n1"])
	}

	// A clean stop revokes the lease: the key goes at once (not after the
	// TTL), and the second daemon takes over.
	stopFirst()
	waitFor("second daemon takes over after the first stops", func(a map[string]datastore.Alive) bool { return a["n1"].PID == 202 })

	stopSecond()
	if got, _ := m.Store.AliveNodes(ctx); len(got) != 0 {
		t.Errorf("alive nodes after every daemon stopped: %v", got)
	}
}

// TestKeepAliveExpiresWithDeadDaemon: a daemon that dies without revoking
// (kill -9: only its client goes away) is no longer alive after the TTL.
func TestKeepAliveExpiresWithDeadDaemon(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	client := m.Client(t)
	quiet := logrus.New()
	quiet.SetOutput(&syncBuffer{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go client.KeepAlive(cctx, datastore.Alive{Node: "dying", PID: 7}, 2*time.Second, quiet)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := m.Store.AliveNodes(ctx); got["dying"].PID == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never marked alive")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The process "dies": its connection closes, nothing is revoked.
	client.Client().Close()
	died := time.Now()
	for {
		got, err := m.Store.AliveNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got["dying"]; !ok {
			break
		}
		if time.Since(died) > 10*time.Second {
			t.Fatal("the dead daemon's liveness key outlived its TTL by far")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if took := time.Since(died); took < time.Second {
		t.Errorf("the key went after %s: it should last about its TTL (2s) when nobody revokes it", took)
	}
}

// TestClaimAlive: a daemon whose node name another live daemon holds (a
// cloned host: same hostname, same Docker engine ID) waits, with an error
// that names the holder, until that lease is gone; this host's own previous
// run (same kernel and pid namespace, process gone) is taken over at once.
func TestClaimAlive(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	quiet := logrus.New()
	quiet.SetOutput(&syncBuffer{})
	self := datastore.LocalAlive("n1", "ENGINE-A")
	if self.BootID == "" || self.PIDNamespace == "" {
		t.Fatalf("LocalAlive found no boot id or pid namespace: %+v", self)
	}
	// The holder: a live process (this one) on "another" host.
	holder := self
	holder.Hostname, holder.BootID = "clone", "another-kernel"
	hctx, stopHolder := context.WithCancel(ctx)
	holderDone := make(chan struct{})
	go func() {
		defer close(holderDone)
		m.Store.KeepAlive(hctx, holder, 3*time.Second, quiet)
	}()
	defer func() { stopHolder(); <-holderDone }()
	eventually(t, 10*time.Second, "holder marked alive", func() bool {
		a, err := m.Store.AliveNodes(ctx)
		return err == nil && a["n1"].BootID == "another-kernel"
	})

	var logs syncBuffer
	second := logrus.New()
	second.SetOutput(&logs)
	type claimed struct {
		lease int64
		err   error
	}
	got := make(chan claimed, 1)
	clone := self
	clone.Hostname, clone.PID = "clone", self.PID+1
	go func() {
		lease, err := m.Store.ClaimAlive(ctx, clone, 3*time.Second, second)
		got <- claimed{int64(lease), err}
	}()
	want := fmt.Sprintf("node name \\\"n1\\\" is held by another live daemon: pid %d on host clone (Docker engine ENGINE-A)", holder.PID)
	eventually(t, 10*time.Second, "the waiting daemon names the holder", func() bool {
		return strings.Contains(logs.String(), want) && strings.Contains(logs.String(), "level=error")
	})
	select {
	case c := <-got:
		t.Fatalf("ClaimAlive returned while another daemon holds the name: %+v", c)
	default:
	}
	if a, _ := m.Store.AliveNodes(ctx); a["n1"].BootID != "another-kernel" {
		t.Fatalf("the waiting daemon took the key: %+v", a["n1"])
	}
	// The holder stops cleanly: the waiting daemon gets the name.
	stopHolder()
	<-holderDone
	select {
	case c := <-got:
		if c.err != nil || c.lease == 0 {
			t.Fatalf("ClaimAlive after the holder stopped: %+v", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ClaimAlive did not return after the holder stopped; log:\n%s", logs.String())
	}
	if a, _ := m.Store.AliveNodes(ctx); a["n1"].PID != clone.PID {
		t.Fatalf("key after the takeover: %+v", a["n1"])
	}

	// That daemon was SIGKILLed (its lease stays until the TTL; its pid,
	// on this kernel, is gone) and restarts: it takes its own key over at
	// once. A pid that no process has: beyond pid_max.
	dead := clone
	dead.PID = 1 << 30
	putAlive(t, m.Store, dead)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second) // below the 3 s TTL
	defer cancel()
	if _, err := m.Store.ClaimAlive(cctx, self, 3*time.Second, quiet); err != nil {
		t.Fatalf("restart on the same host: %v", err)
	}
	if a, _ := m.Store.AliveNodes(ctx); a["n1"].PID != self.PID {
		t.Fatalf("key after the restart: %+v", a["n1"])
	}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// putAlive leaves a liveness key under a fresh 3 s lease that nobody keeps
// alive: what a SIGKILLed daemon leaves behind.
func putAlive(t *testing.T, s *datastore.Store, a datastore.Alive) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := s.Client().Grant(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Put(ctx, s.Prefix()+datastore.NodeAliveKey(a.Node), string(datastore.MustJSON(a)), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
}
