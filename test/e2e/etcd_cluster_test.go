package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// etcdMember is one member of the test's etcd cluster, in its own netns
// host on the fabric.
type etcdMember struct {
	name   string
	host   *harness.Host
	proc   *harness.Process
	client string // http://IP:2379
}

// startEtcdCluster starts n members, each in its own netns host (fixed
// ports: every host has its own), as one new cluster.
func startEtcdCluster(t *testing.T, fab *harness.Fabric, n int) []*etcdMember {
	t.Helper()
	harness.RequireFile(t, harness.EtcdPath, "package etcd-server")
	token := "cnme2e-cluster-" + randHexE2E(4)
	var ms []*etcdMember
	var initial []string
	for i := 0; i < n; i++ {
		h := fab.AddHost(t, fmt.Sprintf("etcd%d", i+1), harness.HostOptions{NoDockerd: true})
		m := &etcdMember{name: fmt.Sprintf("m%d", i+1), host: h, client: "http://" + net.JoinHostPort(h.IP.String(), "2379")}
		initial = append(initial, m.name+"=http://"+net.JoinHostPort(h.IP.String(), "2380"))
		ms = append(ms, m)
	}
	for _, m := range ms {
		peer := "http://" + net.JoinHostPort(m.host.IP.String(), "2380")
		// Ready once the client port listens: a member serves only when a
		// quorum is up, which needs the next ones started too.
		m.proc = m.host.StartProcess(t, "etcd-"+m.name, nil, harness.TCPReady(strings.TrimPrefix(m.client, "http://")),
			harness.EtcdPath, "--name", m.name, "--data-dir", m.host.Dir+"/etcd-data",
			"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", token)
	}
	return ms
}

func randHexE2E(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// etcdLeader returns the member that is leader now, as the members say.
func etcdLeader(ms []*etcdMember) (*etcdMember, error) {
	for _, m := range ms {
		if m.proc.Exited() {
			continue
		}
		out, err := mhRun(context.Background(), "etcdctl", "--endpoints", m.client, "--command-timeout", "2s", "endpoint", "status", "-w", "json")
		if err != nil {
			continue
		}
		var st []struct {
			Status struct {
				Header struct {
					MemberID uint64 `json:"member_id"`
				} `json:"header"`
				Leader uint64 `json:"leader"`
			}
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 {
			continue
		}
		if st[0].Status.Leader != 0 && st[0].Status.Leader == st[0].Status.Header.MemberID {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no member reports itself leader")
}

// clusterCalls counts the plugin calls of the fault test.
type clusterCalls struct {
	made, failed atomic.Int64
	mu           sync.Mutex
	longest      time.Duration
	longestWhat  string
	badErrors    []string
	held         map[string]string // address -> endpoint id, of every kept assignment
	dups         []string
	// unreleased are addresses whose ReleaseAddress (after a failed
	// CreateEndpoint) failed too, by socket: Docker gives up on them, and
	// reconcile releases them once Docker answers; the test releases them
	// again after the fault.
	unreleased map[string]string
}

// call makes one plugin call and records its duration and error.
func (c *clusterCalls) call(ctx context.Context, sock, method string, req, resp any, timeout time.Duration) error {
	start := time.Now()
	err := harness.PluginCall(ctx, sock, method, req, resp)
	d := time.Since(start)
	c.made.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > c.longest {
		c.longest, c.longestWhat = d, method
	}
	if err != nil {
		c.failed.Add(1)
		if !strings.Contains(err.Error(), "datastore") || !strings.Contains(err.Error(), "unreachable") {
			c.badErrors = append(c.badErrors, fmt.Sprintf("%s: %v", method, err))
		}
	}
	if d > timeout+2*time.Second {
		c.badErrors = append(c.badErrors, fmt.Sprintf("%s took %s (etcd timeout %s): %v", method, d.Round(time.Millisecond), timeout, err))
	}
	return err
}

// TestEtcdClusterLeaderFailure: three calico-cnm hosts on a 3-member etcd
// cluster assign addresses and create endpoints concurrently, as dockerd
// would, while the etcd leader is SIGKILLed and later restarted. Every call
// succeeds or fails within --etcd-timeout with "datastore unreachable", no
// address is assigned twice, `ipam check` finds nothing once the member is
// back, and the daemons follow the cluster without restarts.
func TestEtcdClusterLeaderFailure(t *testing.T) {
	t.Parallel()
	const (
		nodes       = 3
		workers     = 4 // concurrent callers per host
		etcdTimeout = 3 * time.Second
		pool        = "10.210.0.0/16"
	)
	bin := harness.BuildBinary(t)
	fab := harness.NewFabric(t, "")
	members := startEtcdCluster(t, fab, 3)
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.client)
	}
	etcd := strings.Join(endpoints, ",")
	harness.Eventually(t, 30*time.Second, 200*time.Millisecond, "etcd cluster has a leader", func() error {
		_, err := etcdLeader(members)
		return err
	})

	env := []string{"ETCD_ENDPOINTS=" + etcd}
	type node struct {
		h          *harness.Host
		p          *harness.Process
		pid        int
		ipam, netw string
		network    string
	}
	var ns []*node
	for i := 0; i < nodes; i++ {
		h := fab.AddHost(t, fmt.Sprintf("cl%d", i), harness.HostOptions{NoDockerd: true})
		// A short resync: reconcile releases the assignments answered as
		// failed during the fault (ipam.Engine.ReleaseAbandoned) at its
		// next pass once etcd answers.
		p := h.StartPlugin(t, bin, env, append(h.ServeArgs(env), "--etcd-timeout", etcdTimeout.String(), "--resync-interval", "2s")...)
		ns = append(ns, &node{h: h, p: p, pid: p.Pid(), ipam: h.PluginDir + "/" + harness.IpamSocket, netw: h.PluginDir + "/" + harness.NetworkSocket, network: fmt.Sprintf("%064x", i+1)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, n := range ns {
		var pr struct{ PoolID string }
		if err := harness.PluginCall(ctx, n.ipam, "/IpamDriver.RequestPool", map[string]any{"AddressSpace": "CalicoLocalAddressSpace", "Pool": pool, "Options": map[string]string{"calico.create-pool": "true"}}, &pr); err != nil {
			t.Fatalf("RequestPool on %s: %v", n.h.Name, err)
		}
		if err := harness.PluginCall(ctx, n.netw, "/NetworkDriver.CreateNetwork", map[string]any{"NetworkID": n.network,
			"IPv4Data": []map[string]any{{"AddressSpace": "CalicoLocalAddressSpace", "Pool": pool}}}, nil); err != nil {
			t.Fatalf("CreateNetwork on %s: %v", n.h.Name, err)
		}
	}

	calls := &clusterCalls{held: map[string]string{}, unreleased: map[string]string{}}
	// One "docker run" as dockerd makes it: RequestAddress, CreateEndpoint,
	// and ReleaseAddress when CreateEndpoint failed.
	container := func(n *node) {
		var ra struct{ Address string }
		if calls.call(ctx, n.ipam, "/IpamDriver.RequestAddress", map[string]any{"PoolID": pool}, &ra, etcdTimeout) != nil {
			return
		}
		ip, _, _ := strings.Cut(ra.Address, "/")
		epID := randHexE2E(32)
		err := calls.call(ctx, n.netw, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": n.network, "EndpointID": epID,
			"Interface": map[string]any{"Address": ip + "/32"}}, nil, etcdTimeout)
		if err != nil {
			if calls.call(ctx, n.ipam, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": pool, "Address": ip}, nil, etcdTimeout) != nil {
				calls.mu.Lock()
				calls.unreleased[ip] = n.ipam
				calls.mu.Unlock()
			}
			return
		}
		calls.mu.Lock()
		defer calls.mu.Unlock()
		if other, dup := calls.held[ip]; dup {
			calls.dups = append(calls.dups, fmt.Sprintf("%s: endpoints %s and %s", ip, other[:12], epID[:12]))
		}
		calls.held[ip] = epID
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range ns {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					container(n)
				}
			}()
		}
	}
	phase := func(what string, d time.Duration) {
		before := calls.made.Load()
		time.Sleep(d)
		t.Logf("%s: %d calls in %s", what, calls.made.Load()-before, d)
	}
	phase("before the fault", 3*time.Second)
	leader, err := etcdLeader(members)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killing etcd leader %s", leader.name)
	leader.proc.Kill9(t)
	phase("leader dead", 10*time.Second)
	leader.proc.Start(t)
	t.Logf("restarted %s", leader.name)
	phase("member back", 5*time.Second)
	close(stop)
	wg.Wait()

	harness.Eventually(t, 30*time.Second, 500*time.Millisecond, "restarted member healthy", func() error {
		_, err := mhRun(ctx, "etcdctl", "--endpoints", leader.client, "endpoint", "health")
		return err
	})
	// The daemons followed the cluster: same processes, and each serves.
	for _, n := range ns {
		if n.p.Exited() || n.p.Pid() != n.pid {
			t.Errorf("daemon on %s restarted or exited (pid %d, was %d)", n.h.Name, n.p.Pid(), n.pid)
		}
		var ra struct{ Address string }
		if err := harness.PluginCall(ctx, n.ipam, "/IpamDriver.RequestAddress", map[string]any{"PoolID": pool}, &ra); err != nil {
			t.Errorf("RequestAddress on %s after the fault: %v", n.h.Name, err)
		} else if err := harness.PluginCall(ctx, n.ipam, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": pool, "Address": strings.Split(ra.Address, "/")[0]}, nil); err != nil {
			t.Errorf("ReleaseAddress on %s after the fault: %v", n.h.Name, err)
		}
	}

	// What reconcile does once Docker answers (these hosts have no
	// dockerd): release what Docker failed to release during the fault.
	for ip, sock := range calls.unreleased {
		if err := harness.PluginCall(ctx, sock, "/IpamDriver.ReleaseAddress", map[string]any{"PoolID": pool, "Address": ip}, nil); err != nil {
			t.Errorf("releasing %s again after the fault: %v", ip, err)
		}
	}
	// Leaks: addresses the datastore holds beyond the kept endpoints once
	// the daemons' reconcile has released what they answered as failed
	// (a few passes), and what the safe `ipam check` reports.
	used, leaks := 0, 0
	leakErr := harness.EventuallyErr(30*time.Second, 500*time.Millisecond, func() error {
		used = 0
		for _, b := range etcdUsage(t, bin, etcd) {
			used += b.Used
		}
		if leaks = used - len(calls.held); leaks != 0 {
			return fmt.Errorf("%d addresses held without a kept endpoint", leaks)
		}
		return nil
	})
	out, checkErr := mhRun(ctx, bin, "ipam", "check", "-o", "json", "--etcd-endpoints", etcd)
	var rep map[string][]string
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("ipam check -o json: %v (%v)\n%s", err, checkErr, out)
	}
	problems := 0
	for _, v := range rep {
		problems += len(v)
	}
	t.Logf("FIGURES: calls made %d, failed %d, longest %s (%s), duplicates %d, leaks %d (datastore holds %d addresses, %d endpoints kept), ipam check problems %d, releases that failed during the fault and were repeated %d",
		calls.made.Load(), calls.failed.Load(), calls.longest.Round(time.Millisecond), calls.longestWhat, len(calls.dups), leaks, used, len(calls.held), problems, len(calls.unreleased))
	for _, e := range calls.badErrors {
		t.Errorf("call outside the contract: %s", e)
	}
	for _, d := range calls.dups {
		t.Errorf("address assigned twice: %s", d)
	}
	if leakErr != nil {
		t.Errorf("30 s after the fault: %v", leakErr)
	}
	if problems != 0 || checkErr != nil {
		t.Errorf("ipam check after the member returned: %v\n%s", checkErr, out)
	}
	if calls.made.Load() < 50 {
		t.Errorf("only %d calls made: the load did not run", calls.made.Load())
	}
}
