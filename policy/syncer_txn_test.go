package policy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// halfDataplane counts the applied rulesets that hold the host endpoint
// without its policy: the host's default deny, cutting it off.
type halfDataplane struct {
	mu             sync.Mutex
	applies, halfs int
	withHost       bool // the last ruleset has host chains
}

func (h *halfDataplane) Apply(ctx context.Context, want Ruleset) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.applies++
	tb, _ := want.Table(IPv4)
	in, ok := tb.Chain(chainHostInput)
	h.withHost = ok
	if ok {
		for _, r := range in.Rules {
			if r.Verdict == Drop && strings.HasSuffix(r.Comment, "no policy (default deny)") {
				h.halfs++
			}
		}
	}
	return 1, nil
}

func (h *halfDataplane) state() (applies, halfs int, withHost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applies, h.halfs, h.withHost
}

// TestSyncerAppliesATransactionWhole writes a host endpoint and the policy
// that opens it in one transaction, and deletes them in one, again and
// again: no pass may program the endpoint without its policy (every
// resource kind of one apply -f is programmed in one pass).
func TestSyncerAppliesATransactionWhole(t *testing.T) {
	m := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := api.DecodeResources(strings.NewReader(`
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: host-open}
spec: {selector: role == 'host', types: [Ingress, Egress], ingress: [{action: Allow}], egress: [{action: Allow}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	res.HostEndpoints = hostState(t).HostEndpoints[:1] // h1-eth0, role host
	hep, pol := res.HostEndpoints[0], res.Policies[0]
	dp := &halfDataplane{}
	s, err := NewSyncer(Config{Store: m.Client(t), Records: etcdtest.Records(t, m.Client(t), RecordKinds()...), Node: "h1", Dataplane: dp, ResyncInterval: time.Hour, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	keys := []string{api.HostEndpointKey(hep.Metadata.Name), api.PolicyKey(pol.Metadata.Name)}
	for round := range 15 {
		if _, err := api.ApplyResources(ctx, m.Store, api.Resources{HostEndpoints: res.HostEndpoints, Policies: res.Policies}); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("round %d: the host endpoint programmed", round), func() error {
			if _, _, with := dp.state(); !with {
				return fmt.Errorf("no host chains")
			}
			return nil
		})
		if err := m.Store.Txn(ctx, datastore.Delete(keys[0], 0), datastore.Delete(keys[1], 0)); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("round %d: the host endpoint removed", round), func() error {
			if _, _, with := dp.state(); with {
				return fmt.Errorf("host chains remain")
			}
			return nil
		})
	}
	if applies, halfs, _ := dp.state(); halfs > 0 {
		t.Errorf("%d of %d passes programmed the host endpoint without its policy", halfs, applies)
	}
}
