package ipam

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
)

// TestMaxBlocksPerHostPerPool: the limit counts a host's blocks in the
// pools a request draws from, as Calico does. A host that owns a block of
// one network's pool still gets a block of a second network's pool; only
// the second pool's own limit stops it.
func TestMaxBlocksPerHostPerPool(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	v.pool("10.1.0.0/24", 0)
	v.config(Config{AutoAllocateBlocks: true, MaxBlocksPerHost: 1})
	within := func(cidr string) *net.IPNet {
		_, n, _ := net.ParseCIDR(cidr)
		return n
	}
	get := func(handle, cidr string) (net.IP, error) {
		ip, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: handle, Within: within(cidr)})
		if err != nil {
			return nil, err
		}
		return ip.IP, nil
	}
	if ip, err := get("net1-a", "10.0.0.0/24"); err != nil || !within("10.0.0.0/24").Contains(ip) {
		t.Fatalf("first network: %v, %v", ip, err)
	}
	// Before the fix: "already owns 1 block(s), the maxBlocksPerHost limit".
	for i := 0; i < 64; i++ {
		if ip, err := get("net2-"+itoa(i), "10.1.0.0/24"); err != nil || !within("10.1.0.0/24").Contains(ip) {
			t.Fatalf("second network, address %d: %v, %v", i, ip, err)
		}
	}
	_, err := get("net2-over", "10.1.0.0/24")
	wantErr(t, err, ErrMaxBlocks, ErrExhausted)
	for _, want := range []string{"pool 10.1.0.0/24", "owns 1 block(s) there", "`calico-cnm ipam configure --max-blocks-per-host N`"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	// The first pool's block still has room: the limit is per pool.
	if ip, err := get("net1-b", "10.0.0.0/24"); err != nil || !within("10.0.0.0/24").Contains(ip) {
		t.Fatalf("first network after the second filled up: %v, %v", ip, err)
	}
	if u := usageByHost(t, v.e)["h1"]; u != 2 {
		t.Errorf("h1 owns %d blocks, want one per pool", u)
	}
}

func usageByHost(t *testing.T, e *Engine) map[string]int {
	t.Helper()
	us, err := e.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, u := range us {
		out[u.Host]++
	}
	return out
}

func TestUpdateConfig(t *testing.T) {
	v := newEnv(t, Options{})
	yes, no, four, minus := true, false, 4, -1
	steps := []struct {
		name string
		ch   ConfigChange
		want Config
		err  error
	}{
		{"nothing set yet: the defaults, strictAffinity on", ConfigChange{StrictAffinity: &yes}, Config{StrictAffinity: true, AutoAllocateBlocks: true}, nil},
		{"one field, the others stay", ConfigChange{MaxBlocksPerHost: &four}, Config{StrictAffinity: true, AutoAllocateBlocks: true, MaxBlocksPerHost: 4}, nil},
		{"two fields", ConfigChange{StrictAffinity: &no, AutoAllocateBlocks: &no}, Config{MaxBlocksPerHost: 4}, nil},
		{"negative limit refused, nothing written", ConfigChange{MaxBlocksPerHost: &minus, StrictAffinity: &yes}, Config{MaxBlocksPerHost: 4}, ErrInvalidArgument},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			got, err := v.e.UpdateConfig(v.ctx, s.ch)
			if s.err != nil {
				wantErr(t, err, s.err)
			} else if err != nil || got != s.want {
				t.Fatalf("UpdateConfig = %+v, %v; want %+v", got, err, s.want)
			}
			if stored, err := v.e.GetConfig(v.ctx); err != nil || stored != s.want {
				t.Fatalf("stored %+v, %v; want %+v", stored, err, s.want)
			}
		})
	}
	if !(ConfigChange{}).Empty() || (ConfigChange{StrictAffinity: &yes}).Empty() {
		t.Error("ConfigChange.Empty is wrong")
	}
}

// TestUpdateConfigConcurrent: two hosts changing different settings at the
// same time both win (a blind write would undo one of them).
func TestUpdateConfigConcurrent(t *testing.T) {
	v := newEnv(t, Options{})
	other := v.engine(Options{})
	for round := 0; round < 10; round++ {
		limit := round + 1
		strict := round%2 == 0
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := v.e.UpdateConfig(v.ctx, ConfigChange{MaxBlocksPerHost: &limit})
			errs <- err
		}()
		go func() {
			defer wg.Done()
			_, err := other.UpdateConfig(v.ctx, ConfigChange{StrictAffinity: &strict})
			errs <- err
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if c, err := v.e.GetConfig(v.ctx); err != nil || c.MaxBlocksPerHost != limit || c.StrictAffinity != strict {
			t.Fatalf("round %d: stored %+v, %v; want limit %d, strict %v", round, c, err, limit, strict)
		}
	}
}

// TestClaimConfigChangedElsewhere: a claim decides on the configuration as
// this engine last read it, and is still bound by a change another process
// made since: the claim's transaction fails on the changed record and the
// claim is decided again on a fresh read, both ways.
func TestClaimConfigChangedElsewhere(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/16", 0)
	other := v.engine(Options{})    // another process on the same datastore
	assign(t, v.e, "h0", "warm-up") // v.e now holds the configuration
	off, on := false, true
	if _, err := other.UpdateConfig(v.ctx, ConfigChange{AutoAllocateBlocks: &off}); err != nil {
		t.Fatal(err)
	}
	// h1 owns no block: with autoAllocateBlocks off it borrows from h0's.
	ip := assign(t, v.e, "h1", "c1")
	if blocks := hostBlocks(t, v.e, "h1"); len(blocks) != 0 {
		t.Fatalf("h1 claimed %v although autoAllocateBlocks was turned off", blocks)
	}
	if h0 := hostBlocks(t, v.e, "h0"); len(h0) != 1 || !h0[0].Contains(ip) {
		t.Fatalf("h1 got %s, want an address borrowed from h0's block %v", ip, h0)
	}
	if _, err := other.UpdateConfig(v.ctx, ConfigChange{AutoAllocateBlocks: &on}); err != nil {
		t.Fatal(err)
	}
	assign(t, v.e, "h1", "c2") // the cached "off" is read again, not trusted
	if blocks := hostBlocks(t, v.e, "h1"); len(blocks) != 1 {
		t.Fatalf("h1 blocks %v after autoAllocateBlocks was turned on again", blocks)
	}
}
