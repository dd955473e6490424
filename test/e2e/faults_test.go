package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/test/e2e/harness"
)

// newFaultHost is newCalicoHost with host options, plugin env and extra
// daemon flags.
func newFaultHost(t *testing.T, name string, opts harness.HostOptions, env []string, extra ...string) *calicoHost {
	t.Helper()
	return startCalicoHost(t, name, opts, env, func(h *harness.Host) []string { return append(h.ServeArgs(env), extra...) })
}

// startCalicoHost is newCalicoHost with host options, plugin env and the
// daemon's whole command line, made from the host.
func startCalicoHost(t *testing.T, name string, opts harness.HostOptions, env []string, args func(*harness.Host) []string) *calicoHost {
	t.Helper()
	harness.RequirePrereqs(t)
	bin := harness.BuildBinary(t)
	h := harness.NewFabric(t, "").AddHost(t, name, opts)
	h.ImportBusybox(t)
	p := h.StartPlugin(t, bin, env, args(h)...)
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 120)
		}
	})
	return &calicoHost{Host: h, bin: bin, plugin: p}
}

// clean reports what is left of workloads on the host: allocated
// addresses, `ipam check` problems, cali veths, /32 routes (nil when clean).
func (h *calicoHost) leftovers(t *testing.T) error {
	t.Helper()
	var problems []string
	if out, err := h.ipamCheck(t); err != nil {
		problems = append(problems, fmt.Sprintf("ipam check: %v: %s", err, strings.TrimSpace(out)))
	}
	if n := h.usedIPs(t); n != 0 {
		problems = append(problems, fmt.Sprintf("%d addresses allocated", n))
	}
	if links := h.caliLinks(t); len(links) != 0 {
		problems = append(problems, fmt.Sprintf("cali veths %v", links))
	}
	if routes := h.workloadRoutes(t); len(routes) != 0 {
		problems = append(problems, fmt.Sprintf("/32 routes %v", routes))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(problems, "; "))
}

// TestKill9DaemonDuringChurn: 50 `docker run` + `docker rm -f` (a loop of
// 25 on each of two hosts: this test and TestKill9DaemonDuringChurnHostB),
// with the daemon SIGKILLed at random moments (about one iteration in
// two, at a random point of the run/rm pair) and restarted each time: at
// once (as systemd would), or twice (once per host) only after Docker's
// calls gave up.
// Docker calls that hit the dead daemon may fail; what must hold is that
// once every container is gone, the daemon (its reconcile with Docker) has
// left no leaked address (`ipam check` clean, 0 allocated), no orphan
// veth and no orphan route.
//
// The two hosts are two top-level tests, not parallel subtests of one: Go
// starts parallel subtests only once their parent returns, behind every
// top-level test still waiting, which made this the run's last test. Side
// by side they take half the time of one host doing all (most of a late
// restart is waiting out Docker's retries).
func TestKill9DaemonDuringChurn(t *testing.T) {
	t.Parallel()
	kill9DuringChurn(t, "kill9a", kill9Iterations, 1)
}

// TestKill9DaemonDuringChurnHostB is TestKill9DaemonDuringChurn's second
// host.
func TestKill9DaemonDuringChurnHostB(t *testing.T) {
	t.Parallel()
	kill9DuringChurn(t, "kill9b", kill9Iterations, 1)
}

// kill9Iterations is how many run/rm pairs each host of
// TestKill9DaemonDuringChurn goes through.
const kill9Iterations = 25

// kill9DuringChurn is TestKill9DaemonDuringChurn on one host (name):
// iterations run/rm pairs, of which at most maxLate restart the daemon only
// after Docker gave up.
func kill9DuringChurn(t *testing.T, name string, iterations, maxLate int) {
	h := newFaultHost(t, name, harness.HostOptions{}, nil, "--reconcile-grace", "3s", "--resync-interval", "3s")
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "calico-net")

	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	kills, lateRestarts, runFails, rmFails := 0, 0, 0, 0
	for i := 0; i < iterations; i++ {
		name := fmt.Sprintf("churn%02d", i)
		// Docker's side runs in the background so that the daemon is
		// restarted right after the kill, as systemd would: Docker's
		// plugin client retries a dead socket for up to 30 s.
		var runErr, rmErr error
		began := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, runErr = h.DockerCtx(context.Background(), "run", "-d", "--name", name, "--net", "calico-net", harness.Image, "sleep", "3600")
			_, rmErr = h.DockerCtx(context.Background(), "rm", "-f", name)
		}()
		late := false
		var restart time.Duration
		if rng.IntN(2) == 0 {
			kills++
			// A random point of the run/rm pair, mostly where docker run
			// calls RequestAddress, CreateEndpoint and Join.
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
			h.plugin.Kill9(t)
			// maxLate times per run the daemon stays down until Docker
			// gave up (its retries last ~30 s): the calls fail and
			// whatever they left is for the restarted daemon to find.
			late = lateRestarts < maxLate && rng.IntN(4) == 0
			if late {
				lateRestarts++
			} else {
				restarted := time.Now()
				h.plugin.Start(t)
				restart = time.Since(restarted)
			}
		}
		<-done
		pair := time.Since(began)
		if late {
			restarted := time.Now()
			h.plugin.Start(t)
			restart = time.Since(restarted)
		}
		// Where a run's minutes go: Docker's own work and its backed-off
		// retries of a dead socket, against the daemon's restart time.
		t.Logf("iteration %d: run+rm %s, daemon restart %s (late %v)", i, pair.Round(10*time.Millisecond), restart.Round(10*time.Millisecond), late)
		if runErr != nil {
			runFails++
			t.Logf("iteration %d: docker run failed: %v", i, runErr)
		}
		if rmErr != nil {
			rmFails++
			t.Logf("iteration %d: docker rm -f failed: %v", i, rmErr)
		}
	}
	t.Logf("%d iterations, %d kills (%d restarted only after Docker gave up), %d docker run and %d docker rm failures", iterations, kills, lateRestarts, runFails, rmFails)
	if kills == 0 {
		t.Fatal("the daemon was never killed: the test proved nothing (re-run)")
	}

	// Whatever Docker could not remove while the daemon was dead goes now.
	harness.Eventually(t, 60*time.Second, time.Second, "all containers removed", func() error {
		ids := strings.Fields(h.MustDocker(t, "ps", "-aq"))
		if len(ids) == 0 {
			return nil
		}
		_, err := h.Docker(t, append([]string{"rm", "-f"}, ids...)...)
		return fmt.Errorf("%d containers left (%v)", len(ids), err)
	})
	// The daemon's reconcile (grace 3 s) releases what Docker no longer
	// knows: no manual `ipam check --release`.
	settle := time.Now()
	first := h.leftovers(t)
	harness.Eventually(t, 60*time.Second, 2*time.Second, "no leaked address, veth or route", func() error {
		return h.leftovers(t)
	})
	t.Logf("right after the churn: %v; clean %s later", first, time.Since(settle).Round(time.Millisecond))
	fixes := 0
	for _, line := range strings.Split(h.plugin.Log(), "\n") {
		if strings.Contains(line, "reconcile pass done") {
			fixes++
			t.Logf("daemon: %s", line[strings.Index(line, "msg="):])
		}
	}
	t.Logf("%d reconcile passes fixed something", fixes)
	// And the host still works.
	h.MustDocker(t, "run", "-d", "--name", "after", "--net", "calico-net", harness.Image, "sleep", "3600")
	h.containerIP(t, "after", "calico-net")
	h.MustDocker(t, "rm", "-f", "after")
	if err := h.leftovers(t); err != nil {
		t.Errorf("after a clean run/rm: %v", err)
	}
}

// dockerTimed runs a docker command with a hard bound far above the one
// under test, so that a hang shows as a measured duration, not a stuck test.
func dockerTimed(h *calicoHost, args ...string) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	out, err := h.DockerCtx(ctx, args...)
	return out, time.Since(start), err
}

// TestEtcdOutage: the daemon uses an external etcd with --etcd-timeout 3s.
// While etcd is frozen (SIGSTOP: connections hang, the worst case) or dead
// (SIGKILL, restarted on the same data dir after 10 s), every Docker call
// that needs the datastore fails within the timeout (plus Docker's own
// overhead) with a message saying the datastore is unreachable; none hangs.
// Once etcd is back, new containers work without any manual step.
func TestEtcdOutage(t *testing.T) {
	t.Parallel()
	const (
		etcdTimeout = 3 * time.Second
		// dockerSlack is Docker's own work around the failing plugin
		// call (container create, rollback).
		dockerSlack = 4 * time.Second
		outage      = 10 * time.Second
	)
	harness.RequirePrereqs(t)
	harness.RequireFile(t, harness.EtcdPath, "package etcd-server")
	bin := harness.BuildBinary(t)
	fab := harness.NewFabric(t, "")
	etcd := harness.StartEtcd(t, fab.Gateway.String())
	h := fab.AddHost(t, "outage", harness.HostOptions{})
	h.ImportBusybox(t)
	env := []string{"ETCD_ENDPOINTS=" + etcd.Endpoint}
	p := h.StartPlugin(t, bin, env, append(h.ServeArgs(env), "--etcd-timeout", etcdTimeout.String())...)
	ch := &calicoHost{Host: h, bin: bin, plugin: p}
	t.Cleanup(func() {
		if t.Failed() {
			h.DumpLogs(t, 80)
		}
	})
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "calico-net")

	for _, mode := range []string{"SIGSTOP", "SIGKILL"} {
		t.Run(mode, func(t *testing.T) {
			tag := strings.ToLower(mode)
			h.MustDocker(t, "run", "-d", "--name", "before-"+tag, "--net", "calico-net", harness.Image, "sleep", "3600")
			h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.200.0/24", "spare-"+tag)

			logMark := len(p.Log())
			down := time.Now()
			switch mode {
			case "SIGSTOP":
				if err := etcd.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				defer etcd.Signal(syscall.SIGCONT) // never leave it frozen
			case "SIGKILL":
				etcd.Kill9(t)
				defer func() {
					if etcd.Exited() {
						etcd.Start(t)
					}
				}()
			}

			// Every call at once, as a busy host would issue them.
			calls := []struct {
				name string
				args []string
				// mustFail: the call needs the datastore. docker rm -f
				// succeeds anyway (Docker ignores driver errors on
				// removal); it must only not hang, and reconcile
				// releases the address later.
				mustFail bool
			}{
				{"docker run", []string{"run", "-d", "--name", "during-" + tag, "--net", "calico-net", harness.Image, "sleep", "3600"}, true},
				{"docker network create", []string{"network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.201.0/24", "new-" + tag}, true},
				// Docker logs DeleteNetwork's error and removes the
				// network anyway.
				{"docker network rm", []string{"network", "rm", "spare-" + tag}, false},
				{"docker rm -f", []string{"rm", "-f", "before-" + tag}, false},
			}
			var wg sync.WaitGroup
			for _, c := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, took, err := dockerTimed(ch, c.args...)
					t.Logf("%s while etcd is down (%s): %s, err=%v %s", c.name, mode, took.Round(time.Millisecond), err, out)
					// docker rm -f makes three plugin calls that need
					// etcd (Leave, DeleteEndpoint, ReleaseAddress), each
					// bounded by the timeout; the per-call bound is
					// checked on the daemon's log below.
					if bound := 3*etcdTimeout + dockerSlack; took > bound {
						t.Errorf("%s took %s with etcd down: want at most %s (3 plugin calls x --etcd-timeout %s + %s Docker overhead)", c.name, took.Round(time.Millisecond), bound, etcdTimeout, dockerSlack)
					}
					if !c.mustFail {
						return
					}
					if err == nil {
						t.Errorf("%s succeeded with etcd down", c.name)
						return
					}
					if !strings.Contains(err.Error(), "unreachable") {
						t.Errorf("%s error does not say the datastore is unreachable: %v", c.name, err)
					}
				}()
			}
			wg.Wait()
			// Docker's retries of the rm -f rollback etc. must not hang either.
			if rest := outage - time.Since(down); rest > 0 {
				time.Sleep(rest)
			}

			switch mode {
			case "SIGSTOP":
				if err := etcd.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			case "SIGKILL":
				etcd.Start(t)
			}
			back := time.Now()
			// No manual step: the next docker run works, give or take the
			// etcd client's reconnect backoff.
			var recovered time.Duration
			harness.Eventually(t, 30*time.Second, 500*time.Millisecond, "docker run after etcd returned", func() error {
				_, _, err := dockerTimed(ch, "run", "-d", "--name", "after-"+tag, "--net", "calico-net", harness.Image, "sleep", "3600")
				if err != nil {
					_, _, _ = dockerTimed(ch, "rm", "-f", "after-"+tag)
					return err
				}
				recovered = time.Since(back)
				return nil
			})
			t.Logf("first successful docker run %s after etcd returned (%s)", recovered.Round(time.Millisecond), mode)
			// Every plugin call Docker made meanwhile answered within the
			// timeout (plus scheduling slack): the bound that matters to
			// Docker, whose own calls time out and retry otherwise.
			reqs := pluginRequests(p.Log()[logMark:])
			failed, slowest := 0, time.Duration(0)
			for _, r := range reqs {
				t.Logf("plugin call %s: code %d in %s", r.method, r.code, r.took.Round(time.Millisecond))
				if r.code != 200 {
					failed++
				}
				slowest = max(slowest, r.took)
				if r.took > etcdTimeout+time.Second {
					t.Errorf("plugin call %s took %s (code %d): want at most --etcd-timeout %s + 1s", r.method, r.took, r.code, etcdTimeout)
				}
			}
			t.Logf("%d plugin calls during the outage and recovery, %d failed, slowest %s", len(reqs), failed, slowest.Round(time.Millisecond))
			if failed == 0 {
				t.Errorf("no plugin call failed during the outage: the daemon's log shows none of them")
			}
			ip := ch.containerIP(t, "after-"+tag, "calico-net")
			if out, err := h.Docker(t, "exec", "after-"+tag, "ip", "-4", "addr", "show", "eth0"); err != nil || !strings.Contains(out, ip.String()+"/32") {
				t.Errorf("container after the outage lacks %s/32 on eth0: %v\n%s", ip, err, out)
			}
			h.MustDocker(t, "rm", "-f", "after-"+tag)
			_, _ = h.Docker(t, "network", "rm", "spare-"+tag)
			_, _ = h.Docker(t, "rm", "-f", "during-"+tag)
		})
	}

	// The container removed during the outage (Docker could not tell us)
	// must not leak its address, veth or route: reconcile cleans it.
	harness.Eventually(t, 90*time.Second, 2*time.Second, "no leftovers after the outages", func() error {
		var problems []string
		used := 0
		for _, b := range etcdUsage(t, bin, etcd.Endpoint) {
			used += b.Used
		}
		if used != 0 {
			problems = append(problems, fmt.Sprintf("%d addresses allocated", used))
		}
		if links := ch.caliLinks(t); len(links) != 0 {
			problems = append(problems, fmt.Sprintf("cali veths %v", links))
		}
		if routes := ch.workloadRoutes(t); len(routes) != 0 {
			problems = append(problems, fmt.Sprintf("/32 routes %v", routes))
		}
		if len(problems) > 0 {
			return fmt.Errorf("%s", strings.Join(problems, "; "))
		}
		return nil
	})
}

// fixedIP is the --ip of the container named "fixed" in the restart tests.
const fixedIP = "192.168.50.50"

// startRestartAlways creates calico-net and runs a --restart=always
// container per name ("fixed" with --ip fixedIP); it returns their addresses.
func (h *calicoHost) startRestartAlways(t *testing.T, names []string) map[string]net.IP {
	t.Helper()
	h.MustDocker(t, "network", "create", "--driver", "calico", "--ipam-driver", "calico-ipam", "--subnet", "192.168.0.0/16", "calico-net")
	ips := map[string]net.IP{}
	for _, n := range names {
		args := []string{"run", "-d", "--restart=always", "--name", n, "--net", "calico-net"}
		if n == "fixed" {
			args = append(args, "--ip", fixedIP)
		}
		h.MustDocker(t, append(args, harness.Image, "sleep", "3600")...)
		ips[n] = h.containerIP(t, n, "calico-net")
	}
	return ips
}

// TestDockerdRestartWithRestartAlways: containers started with
// --restart=always survive a dockerd restart with working networking:
// running again, addressed, plumbed (one veth and route each), able to
// reach each other, and with nothing leaked from their previous
// incarnation. What dockerd 20.10 does: at shutdown Leave, DeleteEndpoint,
// ReleaseAddress per container; at start RequestAddress (with the address
// only for a container created with --ip), CreateEndpoint, Join. So a
// container with --ip gets its address back exactly; the others get a
// fresh one from the pool (Docker does not tell IPAM which container asks).
func TestDockerdRestartWithRestartAlways(t *testing.T) {
	t.Parallel()
	h := newFaultHost(t, "restart", harness.HostOptions{DockerdDebug: true}, nil)
	// always1/2 get whatever calico-ipam picks; fixed has --ip, which
	// Docker keeps in the container's config and asks for again.
	names := []string{"always1", "always2", "fixed"}
	before := h.startRestartAlways(t, names)
	t.Logf("before the restart: %v", before)

	mark := len(h.plugin.Log())
	h.RestartDockerd(t)

	harness.Eventually(t, 60*time.Second, time.Second, "restart=always containers running again", func() error {
		for _, n := range names {
			out, err := h.Docker(t, "inspect", "-f", "{{.State.Running}}", n)
			if err != nil || out != "true" {
				return fmt.Errorf("%s running=%q %v", n, out, err)
			}
		}
		return nil
	})
	var calls []string
	for _, r := range pluginRequests(h.plugin.Log()[mark:]) {
		calls = append(calls, fmt.Sprintf("%s=%d", strings.TrimPrefix(r.method, "/"), r.code))
	}
	t.Logf("plugin calls across the dockerd restart: %v", calls)

	after := map[string]net.IP{}
	for _, n := range names {
		after[n] = h.containerIP(t, n, "calico-net")
		if !after[n].Equal(before[n]) {
			t.Logf("%s came back with %s (had %s)", n, after[n], before[n])
		}
		addr := h.MustDocker(t, "exec", n, "ip", "-4", "addr", "show", "eth0")
		if !strings.Contains(addr, after[n].String()+"/32") {
			t.Errorf("%s: eth0 lacks %s/32 after the restart:\n%s", n, after[n], addr)
		}
		if routes := h.MustDocker(t, "exec", n, "ip", "route"); !strings.Contains(routes, "default via 169.254.1.1 dev eth0") {
			t.Errorf("%s: no default route via 169.254.1.1 after the restart:\n%s", n, routes)
		}
	}
	if got := after["fixed"].String(); got != fixedIP {
		t.Errorf("the --ip %s container came back with %s", fixedIP, got)
	}
	distinct := map[string]bool{}
	for _, ip := range after {
		distinct[ip.String()] = true
	}
	if len(distinct) != len(names) {
		t.Fatalf("containers share addresses after the restart: %v", after)
	}
	for i, n := range names {
		peer := after[names[(i+1)%len(names)]]
		if out, err := h.Docker(t, "exec", n, "ping", "-c", "2", "-W", "2", peer.String()); err != nil {
			t.Errorf("%s cannot ping %s after the dockerd restart: %v\n%s", n, peer, err, out)
		}
	}
	if got := len(h.caliLinks(t)); got != len(names) {
		t.Errorf("%d cali veths after the restart, want %d: %v", got, len(names), h.caliLinks(t))
	}
	if got := len(h.workloadRoutes(t)); got != len(names) {
		t.Errorf("%d /32 routes after the restart, want %d: %v", got, len(names), h.workloadRoutes(t))
	}
	if got := h.usedIPs(t); got != len(names) {
		t.Errorf("%d addresses allocated after the restart, want %d (the old ones leaked?)", got, len(names))
	}
	if out, err := h.ipamCheck(t); err != nil {
		t.Errorf("ipam check after the restart: %v\n%s", err, out)
	}

	for _, n := range names {
		h.MustDocker(t, "rm", "-f", n)
	}
	harness.Eventually(t, 30*time.Second, time.Second, "clean after removal", func() error { return h.leftovers(t) })
}

type pluginRequest struct {
	method string
	code   int
	took   time.Duration
}

// pluginRequests parses the daemon's debug lines `msg="plugin request"
// code=500 duration=3.0001s method=/IpamDriver.RequestAddress`.
func pluginRequests(log string) []pluginRequest {
	var out []pluginRequest
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `msg="plugin request"`) {
			continue
		}
		var r pluginRequest
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "method":
				r.method = v
			case "code":
				r.code, _ = strconv.Atoi(v)
			case "duration":
				r.took, _ = time.ParseDuration(v)
			}
		}
		out = append(out, r)
	}
	return out
}

// TestDockerdLiveRestore: dockerd --live-restore is Docker's way of keeping
// containers through a daemon restart, and with it every container keeps
// its address - dynamic or --ip - and its traffic flows throughout: while
// dockerd is down (and the plugin is restarted meanwhile, as on a package
// upgrade) the containers reach each other; once dockerd is back they are
// the same processes with the same addresses, veths and routes, and the
// plugin's reconcile, given time to act, releases nothing.
func TestDockerdLiveRestore(t *testing.T) {
	t.Parallel()
	const metricsAddr = "127.0.0.1:9091"
	h := newFaultHost(t, "liverestore", harness.HostOptions{DockerdDebug: true, LiveRestore: true}, nil,
		"--metrics-listen", metricsAddr, "--reconcile-grace", "3s")
	names := []string{"live1", "live2", "fixed"}
	before := h.startRestartAlways(t, names)
	pids := map[string]string{}
	for _, n := range names {
		pids[n] = h.MustDocker(t, "inspect", "-f", "{{.State.Pid}}", n)
	}
	linksBefore := h.caliLinks(t)
	routesBefore := h.workloadRoutes(t)
	t.Logf("before the restart: addresses %v, pids %v", before, pids)

	// pingFromContainer enters the container's network namespace by its
	// pid: it works while dockerd is down.
	pingFromContainer := func(from string, to net.IP) error {
		out, err := h.Exec(t, "nsenter", "--net=/proc/"+pids[from]+"/ns/net", "ping", "-c", "2", "-W", "2", to.String())
		if err != nil {
			return fmt.Errorf("%s cannot ping %s: %v\n%s", from, to, err, out)
		}
		return nil
	}
	pingRing := func(when string) {
		t.Helper()
		for i, n := range names {
			if err := pingFromContainer(n, before[names[(i+1)%len(names)]]); err != nil {
				t.Errorf("%s: %v", when, err)
			}
		}
	}
	pingRing("before the restart")

	mark := len(h.plugin.Log())
	h.StopDockerd(t)
	for _, n := range names {
		pid, _ := strconv.Atoi(pids[n])
		if err := syscall.Kill(pid, 0); pid <= 0 || err != nil {
			t.Fatalf("container %s (pid %s) died with dockerd despite --live-restore: %v", n, pids[n], err)
		}
	}
	pingRing("dockerd down")
	h.plugin.Restart(t)
	pingRing("dockerd down, plugin restarted")
	// The restarted plugin's reconcile cannot reach Docker: it must keep
	// every address and route however long that lasts. Its first pass
	// (at start; the next is an interval away) has counted itself once
	// it is over.
	harness.Eventually(t, 60*time.Second, 200*time.Millisecond, "the restarted plugin's reconcile pass without Docker", func() error {
		out, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+metricsAddr+"/metrics")
		if err != nil {
			return err
		}
		if n := metricFamilyTotal(out, "calico_cnm_reconcile_runs_total"); n < 1 {
			return fmt.Errorf("%v passes", n)
		}
		return nil
	})
	pingRing("dockerd down, after a reconcile pass")

	h.StartDockerd(t)
	restarted := time.Now()
	for _, n := range names {
		if got := h.MustDocker(t, "inspect", "-f", "{{.State.Running}} {{.State.Pid}}", n); got != "true "+pids[n] {
			t.Errorf("%s after the restart: running and pid %q, want \"true %s\" (the same process)", n, got, pids[n])
		}
		if got := h.containerIP(t, n, "calico-net"); !got.Equal(before[n]) {
			t.Errorf("%s has %s after the restart, had %s", n, got, before[n])
		}
	}
	pingRing("dockerd back")

	// Reconcile passes with Docker answering, past the grace period.
	okRuns := func() float64 {
		out, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+metricsAddr+"/metrics")
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		return metricSample(out, `calico_cnm_reconcile_runs_total{result="ok"}`)
	}
	runsAtRestart := okRuns()
	harness.Eventually(t, 60*time.Second, 500*time.Millisecond, "reconcile passes after dockerd returns", func() error {
		if time.Since(restarted) < 8*time.Second || okRuns() < runsAtRestart+2 {
			return fmt.Errorf("ok passes %v (had %v at the restart)", okRuns(), runsAtRestart)
		}
		return nil
	})
	metrics, err := h.Exec(t, "curl", "-sS", "-f", "--max-time", "5", "http://"+metricsAddr+"/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	if fixes := metricFamilyTotal(metrics, "calico_cnm_reconcile_fixes_total"); fixes != 0 {
		t.Errorf("reconcile made %v repairs across a live restore, want 0", fixes)
	}
	var calls []string
	for _, r := range pluginRequests(h.plugin.Log()[min(mark, len(h.plugin.Log())):]) {
		calls = append(calls, fmt.Sprintf("%s=%d", strings.TrimPrefix(r.method, "/"), r.code))
	}
	t.Logf("plugin calls across the live restore: %v", calls)

	if got := h.caliLinks(t); !sameStrings(got, linksBefore) {
		t.Errorf("cali veths changed across the restart: %v -> %v", linksBefore, got)
	}
	if got := h.workloadRoutes(t); !sameStrings(got, routesBefore) {
		t.Errorf("workload routes changed across the restart: %v -> %v", routesBefore, got)
	}
	if got := h.usedIPs(t); got != len(names) {
		t.Errorf("%d addresses allocated after the restart, want %d", got, len(names))
	}
	if out, err := h.ipamCheck(t); err != nil {
		t.Errorf("ipam check after the restart: %v\n%s", err, out)
	}
	pingRing("after reconcile")

	for _, n := range names {
		h.MustDocker(t, "rm", "-f", n)
	}
	harness.Eventually(t, 30*time.Second, time.Second, "clean after removal", func() error { return h.leftovers(t) })
}

// metricSample is the value of one exact sample (name with labels) in a
// Prometheus text exposition, 0 when absent.
func metricSample(exposition, sample string) float64 {
	for _, line := range strings.Split(exposition, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// metricFamilyTotal sums every sample of a metric family.
func metricFamilyTotal(exposition, family string) float64 {
	var total float64
	for _, line := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(line, family+"{") || strings.HasPrefix(line, family+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

func sameStrings(a, b []string) bool {
	a, b = append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(a)
	sort.Strings(b)
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}
