package ipam

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkSimultaneousClaims: N hosts each claim their first block at the
// same moment through one engine (as the BGP scale bench does).
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
				b.ReportMetric(float64(st.Txns-st0.Txns)/float64(hosts), "txns/claim")
				b.ReportMetric(float64(st.Reads-st0.Reads)/float64(hosts), "reads/claim")
				b.ReportMetric(float64(e.lostClaims.Load()), "lost")
			}
		})
	}
}
