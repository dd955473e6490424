package ports

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/lastpass"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nft"
)

// Dataplane is what the manager needs of the host's interfaces
// (*dataplane.Linux).
type Dataplane interface {
	// SetRouteLocalnet lets 127.0.0.0/8 traffic leave (and its replies
	// enter) through a workload's host-side veth: see the notes in nft.go (this package).
	SetRouteLocalnet(ctx context.Context, hostIfName string, on bool) error
}

// Manager publishes ports of this host's endpoints. All its changes are
// serialised: one daemon serves one host, so a mutex is what keeps two
// containers from taking the same host port at once.
type Manager struct {
	// store takes the manager's writes; records (the datastore syncer) is
	// what it reads.
	store   *datastore.Store
	records datastore.Records
	node    string
	nft     *nft.Tables
	dp      Dataplane
	ipv6    bool
	log     logrus.FieldLogger
	mu      sync.Mutex
	// engineID gives this host's Docker engine ID ("" while unknown; nil:
	// never known): records of another engine sharing the node name are
	// neither published nor counted as taken.
	engineID func() string
	// last is the outcome of the last resync (Health).
	last *lastpass.Outcome
}

// NewManager publishes through nft (the tables called TableName; see
// NewTables) and dp (route_localnet, nil to skip) the ports of node's
// endpoints in store; ipv6 adds the ip6 table;
// engineID (nil: unknown) tells this host's endpoint records from those a
// host sharing the node name wrote.
func NewManager(store *datastore.Store, records datastore.Records, node string, tables *nft.Tables, dp Dataplane, ipv6 bool, engineID func() string, log logrus.FieldLogger) *Manager {
	if log == nil {
		log = logrus.StandardLogger()
	}
	if engineID == nil {
		engineID = func() string { return "" }
	}
	return &Manager{store: store, records: records, node: node, nft: tables, dp: dp, ipv6: ipv6, engineID: engineID, log: log.WithField("component", "ports"), last: lastpass.New("published ports")}
}

type record struct {
	ep  datastore.Endpoint
	rev int64
}

// load reads this host's endpoint records (not those of another engine
// under the same node name).
func (m *Manager) load(ctx context.Context) ([]record, error) {
	// The syncer's memory must hold every write so far (the Join's, the
	// last Publish's): port conflicts are decided on it.
	rev, err := m.store.Revision(ctx)
	if err == nil {
		err = m.records.WaitRevision(ctx, rev)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the endpoints of %s: %w", m.node, err)
	}
	return m.listed(), nil
}

// loadOwn is load for a withdrawal, which needs only this daemon's own
// writes in the syncer's memory (a node's endpoint records are written by
// its daemon alone): it waits, bounded, for the highest revision this
// process has seen answered instead of asking etcd for its revision. A
// container without published ports is then removed without a datastore
// round trip, which Docker would otherwise wait out while etcd is down.
func (m *Manager) loadOwn(ctx context.Context) ([]record, error) {
	wctx, cancel := context.WithTimeout(ctx, m.store.RequestTimeout())
	defer cancel()
	if err := m.records.WaitRevision(wctx, m.store.SeenRevision()); err != nil {
		return nil, fmt.Errorf("reading the endpoints of %s: %w", m.node, err)
	}
	return m.listed(), nil
}

// listed is this node's endpoint records in the syncer's memory, as
// records of this engine.
func (m *Manager) listed() []record {
	recs, _ := m.records.List(datastore.EndpointKey(m.node, ""))
	engine := m.engineID() // one view of it for the whole list
	out := make([]record, 0, len(recs))
	for _, r := range recs {
		if w, ok := r.Value.(*datastore.WorkloadEndpoint); ok && !w.OfOtherEngine(engine) {
			out = append(out, record{ep: w.Endpoint, rev: r.ModRevision})
		}
	}
	return out
}

// internalState is what the guard of --internal networks needs: the pools
// and the host interfaces of joined endpoints of internal networks.
type internalState struct {
	pools  []netip.Prefix
	ifaces []string
}

// loadInternal reads the pools and which networks are --internal.
func (m *Manager) loadInternal(ctx context.Context, recs []record) (internalState, error) {
	var st internalState
	pools, _ := m.records.List(ipam.PoolsPrefix)
	for _, p := range datastore.Values[ipam.PoolInfo](pools) {
		st.pools = append(st.pools, p.Prefix.Masked())
	}
	nets, _ := m.records.List(datastore.NetworksPrefix)
	internal := map[string]bool{}
	for _, n := range datastore.Values[datastore.Network](nets) {
		if n.Options[OptInternal] == "true" {
			internal[n.ID] = true
		}
	}
	for _, r := range recs {
		if r.ep.Joined && internal[r.ep.Network] && r.ep.HostIfName != "" {
			st.ifaces = append(st.ifaces, r.ep.HostIfName)
		}
	}
	return st, nil
}

// entries are the active bindings: those of joined endpoints.
func entries(recs []record) []entry {
	var out []entry
	for _, r := range recs {
		if !r.ep.Joined {
			continue
		}
		v4, v6 := r.ep.Addrs()
		for _, b := range r.ep.Ports {
			out = append(out, entry{b: b, endpoint: r.ep.ID, v4: v4, v6: v6})
		}
	}
	return out
}

// apply programs the tables for recs.
func (m *Manager) apply(ctx context.Context, recs []record) error {
	es := entries(recs)
	in, err := m.loadInternal(ctx, recs)
	if err != nil {
		return err
	}
	changes, err := m.nft.Apply(ctx, desired(m.ipv6, es, in))
	if err != nil {
		return fmt.Errorf("programming table %s: %w", TableName, err)
	}
	if changes > 0 {
		m.log.WithFields(logrus.Fields{"bindings": len(es), "changes": changes}).Info("published ports programmed")
	}
	return nil
}

// Sync programs the tables from the datastore: at start, and on resync.
func (m *Manager) Sync(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs, err := m.load(ctx)
	if err != nil {
		return err
	}
	return m.apply(ctx, recs)
}

// Run syncs every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := m.Sync(ctx)
		if ctx.Err() != nil {
			return
		}
		m.last.Record(err)
		if err != nil {
			m.log.WithError(err).Warn("published ports resync failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Health is nil unless the last resync failed (/healthz).
func (m *Manager) Health() error { return m.last.Err() }

// Publish resolves and records the endpoint's bindings and programs them.
// On any failure nothing of it remains: the record keeps its old bindings
// and the tables their old rules.
func (m *Manager) Publish(ctx context.Context, endpointID string, reqs []Request) ([]datastore.PortBinding, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs, err := m.load(ctx)
	if err != nil {
		return nil, err
	}
	self := -1
	var taken []datastore.PortBinding
	var owners []string
	for i, r := range recs {
		if r.ep.ID == endpointID {
			self = i
			continue
		}
		if !r.ep.Joined {
			continue
		}
		v4, _ := r.ep.Addrs()
		for _, b := range r.ep.Ports {
			taken = append(taken, b)
			owners = append(owners, fmt.Sprintf("endpoint %s (%s) of this host", dataplane.ShortID(r.ep.ID), v4))
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("endpoint %s is not known on host %s", dataplane.ShortID(endpointID), m.node)
	}
	bs, err := Resolve(reqs, taken, func(i int) string { return owners[i] })
	if err != nil {
		return nil, err
	}
	old := recs[self].ep.Ports
	if err := m.write(ctx, &recs[self], bs); err != nil {
		return nil, err
	}
	if err := m.program(ctx, recs, recs[self].ep, len(bs) > 0); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if werr := m.write(cctx, &recs[self], old); werr != nil {
			m.log.WithError(werr).Error("restoring the bindings of a failed publish")
		}
		if aerr := m.apply(cctx, recs); aerr != nil {
			m.log.WithError(aerr).Error("restoring the tables after a failed publish")
		}
		return nil, err
	}
	m.log.WithField("endpoint", dataplane.ShortID(endpointID)).WithField("ports", Summary(bs)).Info("ports published")
	return bs, nil
}

// program sets route_localnet for an endpoint with IPv4 bindings and
// writes the tables.
func (m *Manager) program(ctx context.Context, recs []record, ep datastore.Endpoint, any bool) error {
	if err := m.apply(ctx, recs); err != nil {
		return err
	}
	if any && m.dp != nil && ep.IPv4 != "" && ep.HostIfName != "" {
		if err := m.dp.SetRouteLocalnet(ctx, ep.HostIfName, true); err != nil {
			return fmt.Errorf("letting 127.0.0.1 reach the published ports through %s: %w", ep.HostIfName, err)
		}
	}
	return nil
}

// write records bs on r's endpoint, re-reading it on a conflict.
func (m *Manager) write(ctx context.Context, r *record, bs []datastore.PortBinding) error {
	key := datastore.EndpointKey(m.node, r.ep.ID)
	return m.store.Retry(ctx, func(ctx context.Context) error {
		if r.rev == 0 {
			var ep datastore.Endpoint
			rev, err := m.store.GetJSON(ctx, key, &ep)
			if err != nil {
				return err
			}
			r.ep, r.rev = ep, rev
		}
		ep := r.ep
		ep.Ports = bs
		rev, err := m.store.TxnRev(ctx, datastore.Update(key, datastore.MustJSON(ep), r.rev))
		if err != nil {
			r.rev = 0
			return err
		}
		r.ep, r.rev = ep, rev
		return nil
	})
}

// Unpublish drops the endpoint's bindings and their rules. An unknown
// endpoint is fine (Docker may retry).
func (m *Manager) Unpublish(ctx context.Context, endpointID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs, err := m.loadOwn(ctx)
	if err != nil {
		return err
	}
	for i := range recs {
		if recs[i].ep.ID != endpointID || len(recs[i].ep.Ports) == 0 {
			continue
		}
		if err := m.write(ctx, &recs[i], nil); err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("forgetting the published ports of endpoint %s: %w", dataplane.ShortID(endpointID), err)
		}
		if recs[i].ep.HostIfName != "" && m.dp != nil {
			if err := m.dp.SetRouteLocalnet(ctx, recs[i].ep.HostIfName, false); err != nil {
				m.log.WithError(err).Debug("route_localnet not reset (the veth may be gone)")
			}
		}
	}
	return m.apply(ctx, recs)
}

// NewTables is the published ports' tables on c.
func NewTables(c *nft.Conn) *nft.Tables { return c.Tables(TableName) }
