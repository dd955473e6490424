package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

// Three hosts, each with its own etcd client and engine, assign 300 addresses
// each from parallel goroutines in a pool that just fits them (16 blocks for
// 15 needed). The host names are chosen so that their block walks start at
// the same block: every claim is a race.
func TestConcurrentHosts(t *testing.T) {
	const (
		hosts   = 3
		perHost = 300
		workers = 4 // parallel requests inside one host, like dockerd's
	)
	v := newEnv(t, Options{})
	pool := v.pool("10.0.0.0/22", 0)
	poolPfx := pfx(pool.CIDR)

	type result struct {
		host, handle string
		ip           netip.Addr
	}
	results := make(chan result, hosts*perHost)
	errs := make(chan error, hosts*workers)
	var wg sync.WaitGroup
	engines := make([]*Engine, hosts)
	names := collidingHosts(poolPfx, hosts)
	for h := 0; h < hosts; h++ {
		host := names[h]
		e := v.engine(Options{})
		engines[h] = e
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < perHost; i += workers {
					handle := fmt.Sprintf("%s-ep%03d", host, i)
					n, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: handle, Attrs: map[string]string{"host": host}})
					if err != nil {
						errs <- fmt.Errorf("%s: %w", handle, err)
						return
					}
					a, _ := addrFromIP(n.IP)
					results <- result{host, handle, a}
				}
			}()
		}
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	byIP := map[netip.Addr]string{}
	byHandle := map[string]netip.Addr{}
	for r := range results {
		if other, dup := byIP[r.ip]; dup {
			t.Fatalf("duplicate IP %s for %s and %s", r.ip, other, r.handle)
		}
		if !poolPfx.Contains(r.ip) {
			t.Fatalf("%s outside the pool", r.ip)
		}
		byIP[r.ip] = r.handle
		byHandle[r.handle] = r.ip
	}
	if len(byIP) != hosts*perHost {
		t.Fatalf("%d addresses, want %d", len(byIP), hosts*perHost)
	}
	// Blocks: each owned by one host, never shared.
	owner := map[netip.Prefix]string{}
	for _, host := range names {
		for _, b := range hostBlocks(t, v.e, host) {
			if o, dup := owner[b]; dup {
				t.Fatalf("block %s owned by %s and %s", b, o, host)
			}
			owner[b] = host
		}
	}
	// What etcd says matches what the callers were told.
	allocs, err := v.e.Allocations(v.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != hosts*perHost {
		t.Fatalf("etcd holds %d allocations, want %d", len(allocs), hosts*perHost)
	}
	for _, a := range allocs {
		ip, _ := addrFromIP(a.IP)
		if byIP[ip] != a.HandleID {
			t.Fatalf("etcd says %s belongs to %s, caller was told %s", ip, a.HandleID, byIP[ip])
		}
		if a.Host != owner[pfx(a.Block)] {
			t.Fatalf("block %s has affinity %s but the affinity records say %s", a.Block, a.Host, owner[pfx(a.Block)])
		}
	}
	live := func(h string) bool { _, ok := byHandle[h]; return ok }
	mustCheckClean(t, v.e, live)

	var txns, reads int64
	for _, e := range engines {
		st := e.store.Stats()
		txns += st.Txns
		reads += st.Reads
	}
	var lost int64
	for _, e := range engines {
		lost += e.lostClaims.Load()
	}
	if lost == 0 {
		t.Errorf("no claim race happened: the test does not test what it should")
	}
	t.Logf("%d blocks claimed, %d claims lost to another host; %d txns + %d reads for %d assignments (%.2f round trips each)",
		len(owner), lost, txns, reads, hosts*perHost, float64(txns+reads)/float64(hosts*perHost))

	// Release everything from the hosts in parallel, then nothing is left.
	var rwg sync.WaitGroup
	for h := 0; h < hosts; h++ {
		host, e := names[h], engines[h]
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for i := 0; i < perHost; i++ {
				handle := fmt.Sprintf("%s-ep%03d", host, i)
				var err error
				if i%2 == 0 {
					err = e.ReleaseIP(context.Background(), toIP(byHandle[handle]))
				} else {
					err = e.ReleaseByHandle(context.Background(), handle)
				}
				if err != nil {
					t.Errorf("release %s: %v", handle, err)
					return
				}
			}
		}()
	}
	rwg.Wait()
	if allocs, _ := v.e.Allocations(v.ctx); len(allocs) != 0 {
		t.Fatalf("%d allocations left after releasing everything", len(allocs))
	}
	mustCheckClean(t, v.e, nil)
}

// collidingHosts finds n host names whose block walks in pool start at the
// same block.
func collidingHosts(pool netip.Prefix, n int) []string {
	byStart := map[netip.Prefix][]string{}
	for i := 0; ; i++ {
		name := fmt.Sprintf("host-%d", i)
		start, _ := blockWalk(pool, 26, name)()
		byStart[start] = append(byStart[start], name)
		if len(byStart[start]) == n {
			return byStart[start]
		}
	}
}
