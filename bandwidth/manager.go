package bandwidth

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// EndpointLimits are the limits of an endpoint record on its network (nil
// record: no network defaults). The endpoint's labels must be known.
func EndpointLimits(ep datastore.Endpoint, nw *datastore.Network) (Limits, error) {
	var netOpts map[string]string
	if nw != nil {
		netOpts = nw.Options
	}
	return Resolve(ep.BandwidthOptions, ep.Labels, netOpts)
}

// Direction names of Stat (the "direction" of the metrics): as seen from
// the container.
const (
	DirIngress = "ingress"
	DirEgress  = "egress"
)

// Stat is the shaping counters of one endpoint in one direction.
type Stat struct {
	EndpointID string
	Direction  string
	Counters
}

// Manager keeps the shaping of this node's endpoints in step with their
// records: Join and Leave call Apply and Remove, Sync (the reconcile pass)
// and Run (datastore changes: a network's defaults, labels learnt after
// Join) repair and update the rest. All kernel changes are serialised.
type Manager struct {
	// records is the datastore syncer's view: the endpoint and network
	// records Sync reads and Run follows.
	records datastore.Records
	node    string
	shaper  *Shaper
	log     logrus.FieldLogger
	// engineID gives this host's Docker engine ID ("" unknown): records
	// another engine under the same node name wrote are left alone.
	engineID func() string

	mu sync.Mutex
	// shaped maps the links shaped (host-side veths and ifb devices) to
	// their endpoint id and direction, for Stats.
	shaped map[string]Stat
	// gen counts Apply and Remove calls; touched says, per endpoint,
	// the gen of its last one and its veth. A Sync leaves alone the
	// endpoints touched after it began reading the records (which it
	// does without the lock, so that a Join never waits for etcd): its
	// view of them is older than theirs.
	gen     uint64
	touched map[string]touch
	// applied is, per endpoint, the veth and the limits its shaping was
	// last given (by a Join, a Leave or a Sync), and netOpts the network
	// options the last Sync read: a record change that resolves to what
	// is applied needs no Sync (affects).
	applied map[string]appliedLimits
	netOpts map[string]map[string]string
}

type appliedLimits struct {
	hostIfName string
	limits     Limits
}

type touch struct {
	gen        uint64
	hostIfName string
}

// NewManager shapes node's endpoints of store through shaper.
func NewManager(records datastore.Records, node string, shaper *Shaper, engineID func() string, log logrus.FieldLogger) *Manager {
	if log == nil {
		log = logrus.StandardLogger()
	}
	if engineID == nil {
		engineID = func() string { return "" }
	}
	return &Manager{records: records, node: node, shaper: shaper, engineID: engineID, log: log.WithField("component", "bandwidth"), shaped: map[string]Stat{}, touched: map[string]touch{}, applied: map[string]appliedLimits{}}
}

func (m *Manager) note(endpointID, hostIfName string, l Limits) {
	m.gen++
	m.touched[endpointID] = touch{gen: m.gen, hostIfName: hostIfName}
	m.applied[endpointID] = appliedLimits{hostIfName: hostIfName, limits: l}
	for _, n := range []string{hostIfName, IfbName(endpointID)} {
		delete(m.shaped, n)
	}
	if l.IngressRate != 0 {
		m.shaped[hostIfName] = Stat{EndpointID: endpointID, Direction: DirIngress}
	}
	if l.EgressRate != 0 {
		m.shaped[IfbName(endpointID)] = Stat{EndpointID: endpointID, Direction: DirEgress}
	}
}

// Apply shapes the endpoint to l (Join: l limits something).
func (m *Manager) Apply(ctx context.Context, endpointID, hostIfName string, l Limits) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.shaper.Apply(ctx, endpointID, hostIfName, l)
	m.note(endpointID, hostIfName, l)
	return err
}

// Remove deletes the endpoint's shaping (Leave, a failed Join).
func (m *Manager) Remove(ctx context.Context, endpointID, hostIfName string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.note(endpointID, hostIfName, Limits{})
	return m.shaper.Remove(ctx, endpointID, hostIfName)
}

// Desired is one endpoint's wanted shaping.
type Desired struct {
	EndpointID string
	HostIfName string
	Limits     Limits
}

// desired reads the joined endpoints of this node with their limits. An
// endpoint whose limits cannot be decided (labels unknown, a bad value
// written into a record since) is in keep, untouched, and so is one
// another Docker engine recorded under this node name. owned are the veths
// of this engine's endpoint records, joined or not: the only veths whose
// qdiscs Sweep may remove.
func (m *Manager) desired(ctx context.Context) (want []Desired, keep, owned map[string]bool, netOpts map[string]map[string]string, err error) {
	epRecs, _ := m.records.List(datastore.EndpointKey(m.node, ""))
	netRecs, _ := m.records.List(datastore.NetworksPrefix)
	nets := map[string]*datastore.Network{}
	netOpts = map[string]map[string]string{}
	for _, n := range datastore.Values[datastore.Network](netRecs) {
		nets[n.ID] = n
		netOpts[n.ID] = n.Options
	}
	engine := m.engineID()
	keep, owned = map[string]bool{}, map[string]bool{}
	for _, w := range datastore.Values[datastore.WorkloadEndpoint](epRecs) {
		ep := w.Endpoint
		if ep.OfOtherEngine(engine) {
			keep[ep.HostIfName], keep[IfbName(ep.ID)] = true, true
			continue
		}
		owned[ep.HostIfName] = true
		if !ep.Joined {
			continue
		}
		log := m.log.WithFields(logrus.Fields{"endpoint": short(ep.ID), "network": short(ep.Network)})
		l, err := EndpointLimits(ep, nets[ep.Network])
		if ep.LabelsUnknown || err != nil {
			if err != nil {
				log.WithError(err).Warn("bandwidth limits of a joined endpoint are invalid: leaving its shaping as it is")
			}
			keep[ep.HostIfName], keep[IfbName(ep.ID)] = true, true
			continue
		}
		if l.None() {
			continue
		}
		keep[ep.HostIfName] = true
		if l.EgressRate != 0 {
			keep[IfbName(ep.ID)] = true
		}
		want = append(want, Desired{EndpointID: ep.ID, HostIfName: ep.HostIfName, Limits: l})
	}
	return want, keep, owned, netOpts, nil
}

// Sync makes the kernel's shaping match the records: every joined
// endpoint of this node shaped as its labels, driver options and network
// say, everything else of ours removed. fixes counts the endpoints
// changed and the leftovers removed.
func (m *Manager) Sync(ctx context.Context) (fixes int, err error) {
	m.mu.Lock()
	began := m.gen
	m.mu.Unlock()
	want, keep, owned, netOpts, err := m.desired(ctx)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.netOpts = netOpts
	// A Join applies after writing its record and a Leave removes after
	// deleting the veth: what they did since the records were read is
	// newer than the records read.
	newer := map[string]bool{}
	for id, tc := range m.touched {
		if tc.gen > began {
			newer[id] = true
			keep[tc.hostIfName], keep[IfbName(id)] = true, true
		} else {
			delete(m.touched, id)
		}
	}
	var errs []error
	shaped := map[string]Stat{}
	applied := map[string]appliedLimits{}
	for id, a := range m.applied {
		if newer[id] {
			applied[id] = a
		}
	}
	for n, st := range m.shaped {
		if newer[st.EndpointID] {
			shaped[n] = st
		}
	}
	for _, d := range want {
		if newer[d.EndpointID] {
			continue
		}
		changed, err := m.shaper.Apply(ctx, d.EndpointID, d.HostIfName, d.Limits)
		if errors.Is(err, ErrNoVeth) {
			// Leaving, or its container is gone: reconcile removes it.
			delete(keep, d.HostIfName)
			delete(keep, IfbName(d.EndpointID))
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", short(d.EndpointID), err))
			continue
		}
		applied[d.EndpointID] = appliedLimits{hostIfName: d.HostIfName, limits: d.Limits}
		if changed {
			fixes++
			m.log.WithFields(logrus.Fields{"endpoint": short(d.EndpointID), "limits": d.Limits.String()}).Info("bandwidth limits applied")
		}
		if d.Limits.IngressRate != 0 {
			shaped[d.HostIfName] = Stat{EndpointID: d.EndpointID, Direction: DirIngress}
		}
		if d.Limits.EgressRate != 0 {
			shaped[IfbName(d.EndpointID)] = Stat{EndpointID: d.EndpointID, Direction: DirEgress}
		}
	}
	m.shaped = shaped
	m.applied = applied
	removed, err := m.shaper.Sweep(ctx, keep, owned)
	if err != nil {
		errs = append(errs, err)
	}
	if removed > 0 {
		m.log.WithField("removed", removed).Info("removed bandwidth shaping no joined endpoint has")
	}
	return fixes + removed, errors.Join(errs...)
}

// Stats are the counters of every endpoint shaped.
func (m *Manager) Stats(ctx context.Context) ([]Stat, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := map[string]bool{}
	for n := range m.shaped {
		names[n] = true
	}
	cs, err := m.shaper.Stats(ctx, names)
	if err != nil {
		return nil, err
	}
	var out []Stat
	for n, c := range cs {
		s := m.shaped[n]
		s.Counters = c
		out = append(out, s)
	}
	return out, nil
}

// changeDebounce gathers a burst of record changes into one pass.
const (
	changeDebounce = 200 * time.Millisecond
	syncTimeout    = time.Minute
)

// Run syncs shortly after each change of a network record or of this
// node's endpoint records (a network's defaults changed, labels learnt
// after Join), until ctx ends. The periodic repair is the reconcile pass's
// (Sync).
func (m *Manager) Run(ctx context.Context) {
	sub := m.records.Subscribe(ctx, "bandwidth", datastore.NetworksPrefix, datastore.EndpointKey(m.node, ""))
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.Ready():
			for _, c := range sub.Take().Changes {
				if debounce == nil && m.affects(c) {
					debounce = time.After(changeDebounce)
				}
			}
		case <-debounce:
			debounce = nil
			sctx, cancel := context.WithTimeout(ctx, syncTimeout)
			if _, err := m.Sync(sctx); err != nil && ctx.Err() == nil {
				m.log.WithError(err).Warn("updating bandwidth limits")
			}
			cancel()
		}
	}
}

// affects tells whether a change of a record may change the kernel's
// shaping: any network change does; an endpoint change not when it
// resolves to the limits already applied to that veth (a Join's own
// write, its shaping done by the Join; a Leave's), nor for a record of
// another engine, nor for labels unknown on a veth not shaped (a Sync
// keeps it as it is). In doubt (a network no Sync has read yet, labels
// unknown on a shaped veth, a bad value) it does, and a Sync decides.
func (m *Manager) affects(c datastore.Change) bool {
	if strings.HasPrefix(c.Key, datastore.NetworksPrefix) {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	have, shaped := m.applied[path.Base(c.Key)]
	shaped = shaped && !have.limits.None()
	if c.Deleted() {
		return shaped
	}
	w, ok := c.New.Value.(*datastore.WorkloadEndpoint)
	if !ok {
		return true
	}
	ep := w.Endpoint
	if ep.OfOtherEngine(m.engineID()) {
		return false
	}
	if !ep.Joined {
		return shaped
	}
	opts, known := m.netOpts[ep.Network]
	if !known {
		return true
	}
	if ep.LabelsUnknown {
		// A Sync leaves such an endpoint's veth as it is (desired keeps
		// it): it can only matter when the endpoint was shaped. A host
		// full of containers Docker cannot name otherwise paid a dump
		// of every link and qdisc per Join.
		return shaped
	}
	l, err := Resolve(ep.BandwidthOptions, ep.Labels, opts)
	if err != nil {
		return true
	}
	if !shaped {
		return !l.None()
	}
	return have.hostIfName != ep.HostIfName || have.limits != l
}

func short(id string) string { return id[:min(12, len(id))] }
