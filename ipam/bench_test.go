package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// BenchmarkAutoAssign measures assignments per second and etcd round trips
// per assignment on an embedded member, for one host and for three hosts
// assigning at the same time (each with its own client and engine). Block
// claims are included (one per 64 assignments); the warm path alone is one
// transaction (see TestWarmPathIsOneTransaction).
func BenchmarkAutoAssign(b *testing.B) {
	for _, hosts := range []int{1, 3} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			v := newEnv(b, Options{})
			v.pool("10.0.0.0/12", 0)
			engines := make([]*Engine, hosts)
			for i := range engines {
				engines[i] = v.engine(Options{})
			}
			var txns0, reads0 int64
			for _, e := range engines {
				st := e.store.Stats()
				txns0 += st.Txns
				reads0 += st.Reads
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for h, e := range engines {
				n := b.N / hosts
				if h < b.N%hosts {
					n++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					host := fmt.Sprintf("bench-%d", h)
					for i := 0; i < n; i++ {
						_, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: fmt.Sprintf("%s-%d", host, i)})
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			var txns, reads int64
			for _, e := range engines {
				st := e.store.Stats()
				txns += st.Txns
				reads += st.Reads
			}
			txns -= txns0
			reads -= reads0
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "assign/s")
			b.ReportMetric(float64(txns+reads)/float64(b.N), "roundtrips/op")
			b.ReportMetric(float64(txns)/float64(b.N), "txns/op")
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
		})
	}
}

// BenchmarkSimultaneousClaims: N hosts each claim their first block at the
// same moment through one engine, as the BGP scale bench does; on an idle
// machine 64 claims take tens of milliseconds, so what that bench
// measures beyond it is load.
func BenchmarkSimultaneousClaims(b *testing.B) {
	for _, hosts := range []int{16, 64} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			for it := 0; it < b.N; it++ {
				v := newEnv(b, Options{})
				v.pool("192.168.0.0/16", 0)
				e := v.engine(Options{})
				st0 := e.store.Stats()
				start := time.Now()
				var wg sync.WaitGroup
				var mu sync.Mutex
				var slowest time.Duration
				for h := 0; h < hosts; h++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						t0 := time.Now()
						host := fmt.Sprintf("n%02d", h)
						if _, err := e.AutoAssign(context.Background(), AutoAssignArgs{Host: host, HandleID: "scale." + host}); err != nil {
							b.Error(err)
						}
						mu.Lock()
						slowest = max(slowest, time.Since(t0))
						mu.Unlock()
					}()
				}
				wg.Wait()
				el := time.Since(start)
				st := e.store.Stats()
				b.ReportMetric(el.Seconds()*1000, "ms-all")
				b.ReportMetric(slowest.Seconds()*1000, "ms-slowest")
				b.ReportMetric(float64(st.Txns-st0.Txns)/float64(hosts), "txns/claim")
				b.ReportMetric(float64(st.Reads-st0.Reads)/float64(hosts), "reads/claim")
				b.ReportMetric(float64(e.lostClaims.Load()), "lost")
			}
		})
	}
}

// BenchmarkAutoAssignOwnedBlocks: the warm path's cost does not grow with
// the blocks a host owns. The host owns blocks-1 full blocks (written
// directly) and one it assigns from; every 60 assignments the timer stops
// while they are released, so each timed assignment is a warm one in a
// host owning that many blocks. allocs/op is the machine-independent
// figure; assign/s moves with the disk.
func BenchmarkAutoAssignOwnedBlocks(b *testing.B) {
	for _, blocks := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			v := newEnv(b, Options{})
			v.pool("10.0.0.0/12", 0)
			e := v.engine(Options{})
			const host = "bench-0"
			ctx := context.Background()
			base := netip.MustParsePrefix("10.0.0.0/26")
			for k := range blocks - 1 {
				p := netip.PrefixFrom(nthAddr(base, k*blockAddrCount(base)), 26)
				full := newBlock(p, host)
				for o := range blockAddrCount(p) {
					full.allocate(o, fmt.Sprintf("fill-%d", k), nil)
				}
				if err := v.m.Store.Txn(ctx,
					datastore.Create(blockKey(p), datastore.MustJSON(full)),
					datastore.Create(affinityKey(host, p), datastore.MustJSON(affinityRecord{State: stateConfirmed}))); err != nil {
					b.Fatal(err)
				}
			}
			// The first assignment claims the block the others come from.
			if _, err := e.AutoAssign(ctx, AutoAssignArgs{Host: host, HandleID: "first"}); err != nil {
				b.Fatal(err)
			}
			if got := len(hostBlocks(b, e, host)); got != blocks {
				b.Fatalf("host owns %d blocks, want %d", got, blocks)
			}
			const batch = 60
			// Round trips of the timed assignments only: the releases'
			// are taken out.
			var released int64
			roundTrips := func() int64 { st := e.store.Stats(); return st.Txns + st.Reads }
			rt0 := roundTrips()
			var timed time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if i > 0 && i%batch == 0 {
					timed += time.Since(start)
					b.StopTimer()
					before := roundTrips()
					for j := i - batch; j < i; j++ {
						if err := e.ReleaseByHandle(ctx, fmt.Sprintf("h-%d", j)); err != nil {
							b.Fatal(err)
						}
					}
					released += roundTrips() - before
					b.StartTimer()
					start = time.Now()
				}
				if _, err := e.AutoAssign(ctx, AutoAssignArgs{Host: host, HandleID: fmt.Sprintf("h-%d", i)}); err != nil {
					b.Fatal(err)
				}
			}
			timed += time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/timed.Seconds(), "assign/s")
			b.ReportMetric(float64(roundTrips()-rt0-released)/float64(b.N), "roundtrips/op")
		})
	}
}
