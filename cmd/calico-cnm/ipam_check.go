package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/reconcile"
)

// defaultLeakMinAge is how old an assignment must be before `ipam check`
// calls it leaked: far beyond the moments Docker legitimately holds an
// address without an endpoint (RequestAddress before CreateEndpoint, 15 s
// of retries of an unreachable plugin).
const defaultLeakMinAge = 10 * time.Minute

// leakEvidence is what `ipam check` judges leaks by: every endpoint
// record, and the endpoints of the one Docker the CLI can ask, this node's.
type leakEvidence struct {
	node   string
	minAge time.Duration
	// docker is nil when it could not be asked.
	docker *reconcile.DockerView
	// nodes are the nodes that have a record (a VTEP address lives as long
	// as its node's record).
	nodes map[string]bool
}

// gatherLeakEvidence reads the endpoint records (first: see
// reconcile.Input) and asks the local Docker (DOCKER_HOST) for its
// endpoints; when Docker does not answer, this node's addresses stay
// unverified.
func (a *app) gatherLeakEvidence(ctx context.Context, store *datastore.Store, minAge time.Duration) (recorded func(ipam.Allocation) bool, ev leakEvidence, err error) {
	ev = leakEvidence{node: a.getenv(plugin.EnvNodeName), minAge: minAge}
	if ev.node == "" {
		if ev.node, err = os.Hostname(); err != nil {
			return nil, ev, fmt.Errorf("%s is not set and the hostname is unreadable: %w", plugin.EnvNodeName, err)
		}
	}
	nodeKVs, err := store.List(ctx, datastore.NodesPrefix)
	if err != nil {
		return nil, ev, err
	}
	ev.nodes = map[string]bool{}
	for _, kv := range nodeKVs {
		ev.nodes[strings.TrimPrefix(string(kv.Key), datastore.NodesPrefix)] = true
	}
	kvs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, ev, err
	}
	addrs, handles := map[netip.Addr]bool{}, map[string]bool{}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) != nil {
			continue
		}
		for _, s := range []string{ep.IPv4, ep.IPv6} {
			if p, err := netip.ParsePrefix(s); err == nil {
				addrs[p.Addr().Unmap()] = true
			}
		}
		for _, h := range ep.Handles {
			handles[h] = true
		}
	}
	recorded = func(al ipam.Allocation) bool {
		ip, _ := netip.AddrFromSlice(al.IP)
		return handles[al.HandleID] || addrs[ip.Unmap()]
	}
	host := a.getenv(plugin.EnvDockerHost)
	log := a.log().WithFields(logrus.Fields{"node": ev.node, "docker": host})
	src, err := reconcile.NewDockerSource(host, log)
	if err != nil {
		return nil, ev, err
	}
	if v, err := src.View(ctx); err != nil {
		log.WithError(err).Warn("Docker does not answer: this node's addresses can only be reported, not released")
	} else {
		ev.docker = &v
	}
	return recorded, ev, nil
}

// leakRules are the rules `ipam check` applies: see ipam.LeakRules.
func (a *app) leakRules(ctx context.Context, store *datastore.Store, minAge time.Duration) (*ipam.LeakRules, error) {
	recorded, ev, err := a.gatherLeakEvidence(ctx, store, minAge)
	if err != nil {
		return nil, err
	}
	inDocker := map[netip.Addr]bool{}
	if ev.docker != nil {
		inDocker = ev.docker.Uses()
	}
	return &ipam.LeakRules{
		Now:    time.Now(),
		MinAge: ev.minAge,
		InUse: func(al ipam.Allocation) bool {
			ip, _ := netip.AddrFromSlice(al.IP)
			return recorded(al) || inDocker[ip.Unmap()]
		},
		Verified:  func(node string) bool { return ev.docker != nil && node == ev.node },
		NodeKnown: func(node string) bool { return ev.nodes[node] },
	}, nil
}

// recheckLeaks keeps of rep's leaks those a fresh check still finds
// leaked: the endpoint records and Docker are read again right before the
// release, and each release then goes by handle, guarded by the revisions
// it reads (ipam.Engine.ReleaseByHandle).
func (a *app) recheckLeaks(ctx context.Context, store *datastore.Store, eng *ipam.Engine, rep ipam.Report, minAge time.Duration) (ipam.Report, error) {
	if len(rep.LeakedHandles) == 0 {
		return rep, nil
	}
	rules, err := a.leakRules(ctx, store, minAge)
	if err != nil {
		return rep, err
	}
	again, err := eng.Check(ctx, rules)
	if err != nil {
		return rep, err
	}
	rep.LeakedHandles = slices.DeleteFunc(rep.LeakedHandles, func(h string) bool {
		return !slices.Contains(again.LeakedHandles, h)
	})
	return rep, nil
}
