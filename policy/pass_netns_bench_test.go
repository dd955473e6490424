package policy

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// BenchmarkKernelPass: one endpoint joins and leaves in turn among n local
// endpoints; each iteration is the calculation and the Apply to a real
// netns, what a Join waits for, so its cost at 1000 endpoints against 10
// shows whether a Join still costs in proportion to the host's endpoints
// (kernel included: adding a jump rule makes the kernel validate every
// jump of the table).
func BenchmarkKernelPass(b *testing.B) {
	for _, policies := range []int{0, 50} {
		for _, n := range []int{10, 1000} {
			b.Run(fmt.Sprintf("policies=%d/endpoints=%d", policies, n), func(b *testing.B) {
				requireNetns(b)
				ns := newNetns(b, "cnmpb-")
				nf, err := NewNFT("/var/run/netns/"+ns, quiet())
				if err != nil {
					b.Fatal(err)
				}
				defer nf.Close()
				st := scaleState(b, policies)
				st.Endpoints = st.Endpoints[:n]
				c, _ := loadedCalc(b, st)
				want, _ := c.CompleteDeferredWork()
				if _, err := nf.Apply(context.Background(), want); err != nil {
					b.Fatal(err)
				}
				last := st.Endpoints[n-1]
				key := datastore.EndpointKey(last.Node, last.ID)
				b.ResetTimer()
				var calc, apply time.Duration
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					e := last
					e.Joined = i%2 == 1
					c.OnUpdate(key, e)
					want, _ := c.CompleteDeferredWork()
					t1 := time.Now()
					if _, err := nf.Apply(context.Background(), want); err != nil {
						b.Fatal(err)
					}
					calc += t1.Sub(t0)
					apply += time.Since(t1)
				}
				b.ReportMetric(float64(calc.Microseconds())/float64(b.N), "calc-us/op")
				b.ReportMetric(float64(apply.Microseconds())/float64(b.N), "apply-us/op")
			})
		}
	}
}

// quiet is a logger for benchmarks: logging would be measured too.
func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}
