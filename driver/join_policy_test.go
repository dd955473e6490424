package driver_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/driver/drivertest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy"
)

// slowTables is a policy dataplane that takes its time (a loaded host) or
// fails, and remembers what is "in the kernel".
type slowTables struct {
	delay time.Duration
	mu    sync.Mutex
	fail  bool
	have  policy.Ruleset
}

func (s *slowTables) Apply(ctx context.Context, want policy.Ruleset) (int, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return 0, errors.New("injected: netlink refused the batch")
	}
	s.have = want
	return 1, nil
}

// programmed: the endpoint's interface is in the kernel's workloads set.
func (s *slowTables) programmed(ifname string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.have.Table(policy.IPv4)
	if !ok {
		return false
	}
	set, _ := t.Set("workloads")
	return slices.Contains(set.Elements, ifname)
}

type staticLabels map[string]string

func (l staticLabels) EndpointLabels(ctx context.Context, req driver.LabelRequest) (map[string]string, error) {
	if l == nil {
		return nil, errors.New("injected: Docker does not answer")
	}
	return l, nil
}

// Issue 12 item 6: Join returns only once the endpoint's rules are in the
// kernel, and fails (leaving nothing) when they cannot get there.
func TestJoinWaitsForPolicy(t *testing.T) {
	m := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tables := &slowTables{delay: 300 * time.Millisecond}
	syncer, err := policy.NewSyncer(policy.Config{Store: m.Store, Records: etcdtest.Records(t, m.Store, policy.RecordKinds()...), Node: testHost, Dataplane: tables, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = syncer.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e := &env{store: m.Store, ipam: drivertest.NewIPAM(ipam.Pool{CIDR: "10.10.0.0/16"}), dp: drivertest.NewDataplane()}
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{
		IPAM: e.ipam, Labels: staticLabels{"role": "frontend"}, Policy: syncer, PolicyWait: 3 * time.Second,
	})
	netID := e.createNetwork(t, false)

	id := e.createEndpoint(t, netID, "10.10.1.50/32", "")
	if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: "/var/run/docker/netns/1"}); err != nil {
		t.Fatal(err)
	}
	if !tables.programmed(dataplane.HostIfName(id)) {
		t.Fatal("Join returned before the endpoint's rules were in the kernel")
	}
	ep, _ := e.endpoint(t, id)
	if ep.Labels["role"] != "frontend" || ep.LabelsUnknown {
		t.Errorf("labels on the record: %+v", ep)
	}
	if syncer.Health() != nil {
		t.Errorf("health: %v", syncer.Health())
	}

	// Labels that cannot be learnt: joined, marked unknown (fail closed).
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{IPAM: e.ipam, Labels: staticLabels(nil), Policy: syncer})
	id2 := e.createEndpoint(t, netID, "10.10.1.51/32", "")
	if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id2, SandboxKey: "/var/run/docker/netns/2"}); err != nil {
		t.Fatal(err)
	}
	if ep, _ := e.endpoint(t, id2); !ep.LabelsUnknown || ep.Labels != nil {
		t.Errorf("record of an endpoint with unknown labels: %+v", ep)
	}

	// The tables cannot be programmed: Join fails within its bound and
	// leaves no veth and no joined record; health says why.
	tables.mu.Lock()
	tables.fail = true
	tables.mu.Unlock()
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{IPAM: e.ipam, Policy: syncer, PolicyWait: time.Second})
	id3 := e.createEndpoint(t, netID, "10.10.1.52/32", "")
	start := time.Now()
	_, err = e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id3, SandboxKey: "/var/run/docker/netns/3"})
	if !errors.Is(err, policy.ErrNotProgrammed) {
		t.Fatalf("Join with failing tables: %v, want ErrNotProgrammed", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("failing Join took %v, bound 1s", d)
	}
	if _, ok := e.dp.Workload(id3); ok {
		t.Error("failed Join left its veth")
	}
	if ep, _ := e.endpoint(t, id3); ep.Joined {
		t.Errorf("failed Join left a joined record: %+v", ep)
	}
	if err := syncer.Health(); !errors.Is(err, policy.ErrNotProgrammed) {
		t.Errorf("health while failing: %v", err)
	}
}
