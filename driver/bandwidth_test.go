package driver_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/policy"
)

// recordingShaper is a driver.Shaper that remembers what is shaped.
type recordingShaper struct {
	mu     sync.Mutex
	shaped map[string]bandwidth.Limits // by endpoint id
}

func (s *recordingShaper) Apply(ctx context.Context, endpointID, hostIfName string, l bandwidth.Limits) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shaped[endpointID] = l
	return nil
}

func (s *recordingShaper) Remove(ctx context.Context, endpointID, hostIfName string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.shaped, endpointID)
	return nil
}

func (s *recordingShaper) get(id string) (bandwidth.Limits, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.shaped[id]
	return l, ok
}

// TestBandwidthLimits: a container's labels and driver options win over its
// network's defaults; the limits are applied before Join returns, kept in
// the record, and removed at Leave; a bad value in a network option, a
// driver option or a label fails the call with an error naming it and
// leaves nothing (no record, no veth, no shaping).
func TestBandwidthLimits(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	shaper := &recordingShaper{shaped: map[string]bandwidth.Limits{}}
	labels := staticLabels{}
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{IPAM: e.ipam, Shaper: shaper, Labels: labels})
	netID := e.createNetworkWith(t, "10.10.1.0/24", map[string]interface{}{
		"com.docker.network.generic": map[string]interface{}{"calico.bandwidth.ingress": "100mbit", "calico.bandwidth.egress": "40mbit"},
	})

	join := func(id string, dockerLabels map[string]string) error {
		clear(labels)
		for k, v := range policy.EndpointLabels(dockerLabels, "/c", "net") {
			labels[k] = v
		}
		_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: "/var/run/docker/netns/" + id[:8]})
		return err
	}

	t.Run("resolution", func(t *testing.T) {
		tests := []struct {
			name       string
			driverOpts map[string]interface{}
			labels     map[string]string
			want       bandwidth.Limits
		}{
			{name: "network defaults", want: bandwidth.Limits{IngressRate: 100e6, EgressRate: 40e6}},
			{name: "labels win", labels: map[string]string{"org.projectcalico.bandwidth.ingress": "50mbit", "org.projectcalico.bandwidth.egress-burst": "64k"},
				want: bandwidth.Limits{IngressRate: 50e6, EgressRate: 40e6, EgressBurst: 64 << 10}},
			{name: "driver options win over labels", driverOpts: map[string]interface{}{"org.projectcalico.bandwidth.egress": "20mbit"},
				labels: map[string]string{"org.projectcalico.bandwidth.egress": "30mbit"},
				want:   bandwidth.Limits{IngressRate: 100e6, EgressRate: 20e6}},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				id := newID('e')
				if _, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
					Interface: &network.EndpointInterface{Address: "10.10.1." + string(rune('1'+i)) + "/32"}, Options: tt.driverOpts}); err != nil {
					t.Fatal(err)
				}
				if err := join(id, tt.labels); err != nil {
					t.Fatal(err)
				}
				if got, ok := shaper.get(id); !ok || got != tt.want {
					t.Fatalf("shaped %+v (%v), want %+v", got, ok, tt.want)
				}
				ep, _ := e.endpoint(t, id)
				if got, err := bandwidth.EndpointLimits(ep, ptr(e.network(t, netID))); err != nil || got != tt.want {
					t.Errorf("limits rebuilt from the records = %+v, %v; want %+v", got, err, tt.want)
				}
				if err := e.nd.Leave(ctx, &network.LeaveRequest{NetworkID: netID, EndpointID: id}); err != nil {
					t.Fatal(err)
				}
				if _, ok := shaper.get(id); ok {
					t.Error("Leave left the shaping")
				}
			})
		}
	})

	bad := []struct {
		name string
		call func(id string) error
		msg  string
	}{
		{"network option with a space", func(id string) error {
			return e.nd.CreateNetwork(ctx, &network.CreateNetworkRequest{NetworkID: id, IPv4Data: v4Data("10.10.2.0/24"),
				Options: map[string]interface{}{"com.docker.network.generic": map[string]interface{}{"calico.bandwidth.ingress": "50 mbits"}}})
		}, `network option calico.bandwidth.ingress="50 mbits"`},
		{"driver option negative", func(id string) error {
			_, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
				Interface: &network.EndpointInterface{Address: "10.10.1.20/32"}, Options: map[string]interface{}{"org.projectcalico.bandwidth.egress": "-1"}})
			return err
		}, `endpoint driver option org.projectcalico.bandwidth.egress="-1"`},
		{"label below 1kbit", func(id string) error {
			if _, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
				Interface: &network.EndpointInterface{Address: "10.10.1.21/32"}}); err != nil {
				return err
			}
			return join(id, map[string]string{"org.projectcalico.bandwidth.ingress": "999bit"})
		}, `bandwidth label org.projectcalico.bandwidth.ingress="999bit"`},
		{"label above 100gbit", func(id string) error {
			if _, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
				Interface: &network.EndpointInterface{Address: "10.10.1.22/32"}}); err != nil {
				return err
			}
			return join(id, map[string]string{"org.projectcalico.bandwidth.egress": "101gbit"})
		}, `bandwidth label org.projectcalico.bandwidth.egress="101gbit"`},
		{"label burst unit", func(id string) error {
			if _, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
				Interface: &network.EndpointInterface{Address: "10.10.1.23/32"}}); err != nil {
				return err
			}
			return join(id, map[string]string{"org.projectcalico.bandwidth.ingress-burst": "64kbytes"})
		}, `bandwidth label org.projectcalico.bandwidth.ingress-burst="64kbytes"`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			id := newID('e')
			adds := e.dp.Adds()
			err := tt.call(id)
			if !errors.Is(err, driver.ErrInvalidRequest) || !errors.Is(err, bandwidth.ErrBadValue) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %v; want ErrInvalidRequest and ErrBadValue naming %s", err, tt.msg)
			}
			if _, ok := e.network(t, id); ok {
				t.Error("a network record was left")
			}
			if ep, ok := e.endpoint(t, id); ok && ep.Joined {
				t.Errorf("a joined endpoint record was left: %+v", ep)
			}
			if _, ok := e.dp.Workload(id); ok {
				t.Error("a veth was left")
			}
			if e.dp.Adds() != adds && !strings.Contains(tt.name, "label") {
				t.Error("a veth was created before the options were checked")
			}
			if _, ok := shaper.get(id); ok {
				t.Error("shaping was left")
			}
		})
	}
}

func ptr[T any](v T, _ bool) *T { return &v }

// overlapProbe is a Shaper and a PolicyWaiter that only finish once the
// other has started: a Join that shapes and waits for its policy one after
// the other never completes either.
type overlapProbe struct {
	shaping, waiting chan struct{}
	applyErr         error
	removed          chan string
}

func (p *overlapProbe) Apply(ctx context.Context, endpointID, hostIfName string, l bandwidth.Limits) error {
	close(p.shaping)
	select {
	case <-p.waiting:
		return p.applyErr
	case <-time.After(5 * time.Second):
		return errors.New("the policy wait did not begin while shaping")
	}
}

func (p *overlapProbe) Remove(ctx context.Context, endpointID, hostIfName string) error {
	p.removed <- endpointID
	return nil
}

func (p *overlapProbe) WaitProgrammed(ctx context.Context, rev int64) error {
	close(p.waiting)
	select {
	case <-p.shaping:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestJoinShapesWhilePolicyIsProgrammed: Join's shaping and its wait for
// the policy overlap (Join costs the longer, not the sum); a shaping
// failure still fails the Join and leaves no record, veth or shaping.
func TestJoinShapesWhilePolicyIsProgrammed(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	e := newEnv(t, m.Store)
	for i, tt := range []struct {
		name     string
		applyErr error
	}{{"both finish", nil}, {"shaping fails", errors.New("no ifb module")}} {
		t.Run(tt.name, func(t *testing.T) {
			p := &overlapProbe{shaping: make(chan struct{}), waiting: make(chan struct{}), applyErr: tt.applyErr, removed: make(chan string, 4)}
			// PolicyWait bounds a Join that does one after the other.
			e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{IPAM: e.ipam, Shaper: p, Policy: p, PolicyWait: 5 * time.Second, Labels: staticLabels{}})
			netID := e.createNetworkWith(t, "10.10."+string(rune('5'+i))+".0/24", map[string]interface{}{
				"com.docker.network.generic": map[string]interface{}{"calico.bandwidth.egress": "40mbit"},
			})
			id := newID('e')
			if _, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{NetworkID: netID, EndpointID: id,
				Interface: &network.EndpointInterface{Address: "10.10." + string(rune('5'+i)) + ".2/32"}}); err != nil {
				t.Fatal(err)
			}
			_, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: "/var/run/docker/netns/" + id[:8]})
			if tt.applyErr == nil {
				if err != nil {
					t.Fatalf("Join = %v; want shaping and the policy wait to overlap", err)
				}
				if ep, _ := e.endpoint(t, id); !ep.Joined {
					t.Fatal("endpoint not recorded as joined")
				}
				return
			}
			if !errors.Is(err, tt.applyErr) {
				t.Fatalf("Join = %v; want the shaping error", err)
			}
			if ep, ok := e.endpoint(t, id); ok && ep.Joined {
				t.Error("the failed Join left the endpoint joined")
			}
			if _, ok := e.dp.Workload(id); ok {
				t.Error("the failed Join left its veth")
			}
			select {
			case got := <-p.removed:
				if got != id {
					t.Errorf("removed the shaping of %s, want %s", got, id)
				}
			default:
				t.Error("the failed Join did not remove its shaping")
			}
		})
	}
}
