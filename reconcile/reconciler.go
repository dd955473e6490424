package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Dataplane is what the reconcile loop repairs in the kernel
// (*dataplane.Linux).
type Dataplane interface {
	// RemoveWorkload deletes the endpoint's veth and host routes; removing
	// what is not there is fine.
	RemoveWorkload(ctx context.Context, endpointID string, ips []net.IPNet) error
	// MissingWorkloadRoutes lists the ips without a host route through
	// hostIfName (dataplane.ErrNoInterface when it does not exist).
	MissingWorkloadRoutes(ctx context.Context, hostIfName string, ips []net.IPNet) ([]net.IPNet, error)
	// EnsureWorkloadRoutes adds the missing host routes.
	EnsureWorkloadRoutes(ctx context.Context, hostIfName string, ips []net.IPNet) error
	// ListDetachedWorkloads lists the host-side names of workload veth
	// pairs no container holds (both ends in the host namespace).
	ListDetachedWorkloads(ctx context.Context) ([]string, error)
	// RemoveDetachedWorkload deletes such a pair, if it is still detached.
	RemoveDetachedWorkload(ctx context.Context, hostIfName string) error
}

// IPAM is what the reconcile loop needs of the address manager
// (*ipam.Engine).
type IPAM interface {
	Allocations(ctx context.Context) ([]ipam.Allocation, error)
	ReleaseByHandle(ctx context.Context, handleID string) error
	// AssignIP re-assigns an address a live endpoint uses (Plan.Reclaim).
	AssignIP(ctx context.Context, a ipam.AssignIPArgs) error
}

// DefaultInterval is the time between periodic passes when the
// Reconciler's Interval is 0 (the daemon passes its resync interval).
const DefaultInterval = 30 * time.Second

// Why Run started a pass (the "trigger" field of its debug log line).
const (
	PassAtStart     = "start"
	PassPeriodic    = "interval"
	PassFollowUp    = "candidates maturing"
	PassDockerEvent = "docker event"
	PassKicked      = "datastore restored"
)

// abandonedReleaser is implemented by *ipam.Engine: assignments it answered
// as failed while etcd could not tell whether they landed are released once
// etcd answers again (by handle: nobody else knows those handles).
type abandonedReleaser interface {
	ReleaseAbandoned(ctx context.Context) (int, error)
}

// Timing of the loop's extra passes.
const (
	// eventDebounce collects a burst of Docker events (docker rm of many
	// containers) into one pass.
	eventDebounce = time.Second
	// minEventGap spaces event-triggered passes: each reads all endpoint
	// and IPAM records, and a busy host (docker run loops) emits events
	// continuously; Docker cleans up after itself then anyway.
	minEventGap = 5 * time.Second
	// minFollowUp bounds how soon a pass for maturing candidates runs.
	minFollowUp = time.Second
	// reconcilePassTimeout bounds one pass.
	reconcilePassTimeout = 2 * time.Minute
)

// Reconciler brings the datastore, IPAM and the kernel in line with what
// Docker really has attached on this node: it cleans up after containers
// that went while the daemon was down (Docker's Leave, DeleteEndpoint and
// ReleaseAddress calls then fail and are never repeated) and restores
// routes that went missing. See MakePlan for the rules.
type Reconciler struct {
	Node      string
	Store     *datastore.Store
	IPAM      IPAM
	Dataplane Dataplane
	// Docker may be nil: then Docker's view is always unknown and only
	// routes are repaired.
	Docker DockerSource
	// Grace: DefaultGrace when 0.
	Grace time.Duration
	// Interval between periodic passes: DefaultInterval when 0.
	Interval       time.Duration
	ReleaseOrphans bool
	Metrics        Metrics // may be nil
	Log            logrus.FieldLogger
	Now            func() time.Time
	// Kick, when set, asks for a pass at once (the datastore was
	// restored: addresses may have to be reclaimed before they are
	// handed out again).
	Kick <-chan struct{}
	// Relabel, when set, learns the labels of an endpoint whose record
	// a pass rebuilt (LabelsUnknown): no Join or connect event will.
	Relabel func(ctx context.Context, endpointID, networkID string)

	// Shaping, when set, rebuilds bandwidth limits in each pass.
	Shaping ShapingSyncer

	mu         sync.Mutex // one pass at a time; guards the fields below
	pending    map[string]time.Time
	dockerDown bool
	warned     map[string]bool // problems reported by the last pass (one warning each)
	stillBad   map[string]bool // problems seen by the running pass
}

// fixed counts repairs (none without Metrics).
func (r *Reconciler) fixed(kind string, n int) {
	if r.Metrics != nil {
		r.Metrics.Fixed(kind, n)
	}
}

// scheduled reports whether an event pass or a follow-up is due (nothing
// without Metrics).
func (r *Reconciler) scheduled(due bool) {
	if r.Metrics != nil {
		r.Metrics.PassScheduled(due)
	}
}

// ran counts a pass (none without Metrics).
func (r *Reconciler) ran(result string) {
	if r.Metrics != nil {
		r.Metrics.ReconcileRun(result)
	}
}

// PassResult is what one pass found and did.
type PassResult struct {
	Plan        Plan
	DockerKnown bool
	// Fixes counts the repairs made, by kind (Fix* constants).
	Fixes map[string]int
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) grace() time.Duration {
	if r.Grace == 0 {
		return DefaultGrace
	}
	return r.Grace
}

// readEndpoints lists the endpoint records of all nodes.
func (r *Reconciler) readEndpoints(ctx context.Context) ([]StoredEndpoint, map[string]bool, error) {
	kvs, err := r.Store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("reading endpoint records: %w", err)
	}
	var out []StoredEndpoint
	for _, kv := range kvs {
		if _, _, ok := datastore.EndpointNodeAndID(kv.Key); !ok {
			continue
		}
		w, err := datastore.ParseEndpoint(kv.Key, kv.Value)
		if err != nil {
			// Leave an unreadable record alone rather than guess.
			r.Log.WithError(err).WithField("key", kv.Key).Warn("unreadable endpoint record: skipping it")
			continue
		}
		ep := w.Endpoint
		if ep.HostIfName == "" {
			ep.HostIfName = dataplane.HostIfName(ep.ID)
		}
		out = append(out, StoredEndpoint{Endpoint: ep, Rev: kv.ModRevision})
	}
	nets, err := r.Store.List(ctx, datastore.NetworksPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("reading network records: %w", err)
	}
	ids := map[string]bool{}
	for _, kv := range nets {
		ids[strings.TrimPrefix(kv.Key, datastore.NetworksPrefix)] = true
	}
	return out, ids, nil
}

// Pass runs one reconcile pass. The error reports what could not be read
// or repaired; the repairs that worked are in the result either way.
func (r *Reconciler) Pass(ctx context.Context) (PassResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, reconcilePassTimeout)
	defer cancel()
	res := PassResult{Fixes: map[string]int{}}
	// Warn once per lasting problem: the last pass's set, pruned to what
	// this pass still sees, so it does not grow with every container.
	r.stillBad = map[string]bool{}
	defer func() { r.warned = r.stillBad }()

	// Read before the pass's input: only a pass over the complete restore
	// releases this node from its hold (a rewrite since fails the guard).
	format, formatRev, holdErr := r.Store.ReadFormat(ctx)
	in, err := r.readInput(ctx)
	if err != nil {
		return res, err
	}
	res.DockerKnown = in.Docker != nil

	plan := MakePlan(in)
	r.pending = plan.Pending
	res.Plan = plan

	err = errors.Join(r.repair(ctx, plan, res.DockerKnown, res.Fixes)...)
	if err == nil && holdErr == nil && res.DockerKnown && format.Restore.Waits(r.Node, time.Now()) {
		if err = r.Store.ReleaseRestoreHold(ctx, r.Node, format, formatRev); err == nil {
			r.Log.WithField("node", r.Node).Info("reconciled after the datastore restore: released this node's hold on new assignments")
		}
	}
	for kind, n := range res.Fixes {
		r.fixed(kind, n)
	}
	switch {
	case err != nil:
		r.ran(ResultFailed)
	case !res.DockerKnown:
		r.ran(ResultNoDocker)
	default:
		r.ran(ResultOK)
	}
	return res, err
}

// readInput reads the sources of truth, the datastore first and Docker
// second: see Input. A failed read of the datastore or IPAM fails
// the pass (and counts so); an unreachable Docker leaves in.Docker nil.
func (r *Reconciler) readInput(ctx context.Context) (Input, error) {
	eps, nets, err := r.readEndpoints(ctx)
	if err != nil {
		r.ran(ResultFailed)
		return Input{}, err
	}
	allocs, err := r.IPAM.Allocations(ctx)
	if err != nil {
		r.ran(ResultFailed)
		return Input{}, fmt.Errorf("reading IPAM allocations: %w", err)
	}
	detached, err := r.Dataplane.ListDetachedWorkloads(ctx)
	if err != nil {
		// Not fatal: the rest of the pass does not depend on it.
		r.Log.WithError(err).Warn("listing detached workload veths")
		detached = nil
	}
	view, err := r.dockerView(ctx)
	if err != nil {
		return Input{}, err
	}
	return Input{
		Node:           r.Node,
		Now:            r.now(),
		Grace:          r.grace(),
		Endpoints:      eps,
		Allocations:    allocs,
		Networks:       nets,
		Detached:       detached,
		Docker:         view,
		FirstSeen:      r.pending,
		ReleaseOrphans: r.ReleaseOrphans,
	}, nil
}

// dockerView is Docker's view, or nil while it is unknown (no Docker
// source, or Docker does not answer: warned about once per outage). The
// only error is ctx's.
func (r *Reconciler) dockerView(ctx context.Context) (*DockerView, error) {
	if r.Docker == nil {
		return nil, nil
	}
	v, err := r.Docker.View(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !r.dockerDown {
			r.Log.WithError(err).Warn("Docker is unreachable: reconcile only restores routes, and releases nothing, until it answers")
		} else {
			r.Log.WithError(err).Debug("Docker still unreachable")
		}
		r.dockerDown = true
		return nil, nil
	}
	if r.dockerDown {
		r.Log.Info("Docker answers again: reconciling endpoints")
	}
	r.dockerDown = false
	return &v, nil
}

// repair carries out plan, counting the repairs made in fixes, and returns
// what failed: one failure does not stop the others.
func (r *Reconciler) repair(ctx context.Context, plan Plan, dockerKnown bool, fixes map[string]int) []error {
	var errs []error
	for _, rm := range plan.RemoveEndpoints {
		if err := r.removeEndpoint(ctx, rm, fixes); err != nil {
			errs = append(errs, err)
		}
	}
	handles, reclaimErrs := r.reclaim(ctx, plan.Reclaim, fixes)
	errs = append(errs, reclaimErrs...)
	errs = append(errs, r.rebuild(ctx, plan.Rebuild, handles, fixes)...)
	errs = append(errs, r.releaseOrphans(ctx, plan.ReleaseOrphans, fixes)...)
	for _, name := range plan.RemoveDetached {
		if err := r.Dataplane.RemoveDetachedWorkload(ctx, name); err != nil {
			errs = append(errs, err)
			continue
		}
		fixes[FixInterfaceRemoved]++
		r.Log.WithField("interface", name).Info("reconcile: removed a veth pair no container and no endpoint record holds")
	}
	for _, ep := range plan.EnsureRoutes {
		if err := r.ensureRoutes(ctx, ep, dockerKnown, fixes); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.syncShaping(ctx, fixes); err != nil {
		errs = append(errs, err)
	}
	rebuilt := map[string]bool{}
	for _, ep := range plan.Rebuild {
		rebuilt[ep.ID] = true
	}
	for _, id := range plan.Unknown {
		if rebuilt[id] {
			continue // logged as rebuilt (or retried next pass)
		}
		if r.secondSighting("unknown/" + id) {
			r.Log.WithFields(logrus.Fields{"endpoint": dataplane.ShortID(id), "node": r.Node}).Warn("Docker has an endpoint on a calico network that the datastore does not record for this node (was NODENAME changed?): leaving it alone")
		}
	}
	return errs
}

// reclaim re-assigns the addresses live endpoints use that no assignment
// holds, and returns the new handles by endpoint id. One that got
// assigned meanwhile (a container that started after the pass read IPAM)
// is in use either way: nothing to do.
func (r *Reconciler) reclaim(ctx context.Context, addrs []AddressReclaim, fixes map[string]int) (map[string][]string, []error) {
	var errs []error
	handles := map[string][]string{}
	for _, a := range addrs {
		log := r.Log.WithFields(logrus.Fields{"ip": a.IP.String(), "endpoint": dataplane.ShortID(a.Endpoint), "network": dataplane.ShortID(a.Network)})
		handle := driver.NewHandleID()
		err := r.IPAM.AssignIP(ctx, ipam.AssignIPArgs{IP: a.IP.AsSlice(), Host: r.Node, HandleID: handle,
			Attrs: map[string]string{ipam.AttrNode: r.Node, ipam.AttrReclaimedFor: a.Endpoint}})
		if errors.Is(err, ipam.ErrAddressInUse) {
			continue
		}
		if errors.Is(err, ipam.ErrNotInPool) {
			// Another IPAM driver's address on a calico network: not ours.
			log.Debug("reconcile: address of a live endpoint is in no pool: not reclaimed")
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("re-assigning %s, in use by Docker endpoint %s: %w", a.IP, dataplane.ShortID(a.Endpoint), err))
			continue
		}
		handles[a.Endpoint] = append(handles[a.Endpoint], handle)
		fixes[FixAddressReclaimed]++
		log.Warn("reconcile: re-assigned an address a running container uses but the datastore had lost (restored from an older backup?)")
	}
	return handles, errs
}

// rebuild writes the records of endpoints whose addresses were all just
// reclaimed (created only if still absent: a Join since wins).
func (r *Reconciler) rebuild(ctx context.Context, eps []datastore.Endpoint, handles map[string][]string, fixes map[string]int) []error {
	var errs []error
	for _, ep := range eps {
		// The plan's handles are of earlier passes' reclaims, these of
		// this pass's.
		ep.Handles = append(slices.Clip(ep.Handles), handles[ep.ID]...)
		if len(ep.Handles) != len(endpointAddrs(ep)) {
			continue // an address was taken meanwhile: not lost after all
		}
		err := r.Store.Txn(ctx, datastore.Create(datastore.EndpointKey(ep.Node, ep.ID), datastore.MustJSON(ep)))
		if errors.Is(err, datastore.ErrConflict) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rebuilding the record of endpoint %s: %w", dataplane.ShortID(ep.ID), err))
			continue
		}
		fixes[FixEndpointRebuilt]++
		r.Log.WithFields(logrus.Fields{"endpoint": dataplane.ShortID(ep.ID), "network": dataplane.ShortID(ep.Network), "ip": strings.Join(nonEmpty(ep.IPv4, ep.IPv6), ",")}).
			Warn("reconcile: rebuilt the record of a running container's endpoint the datastore had lost")
		if r.Relabel != nil {
			r.Relabel(ctx, ep.ID, ep.Network)
		}
	}
	return errs
}

// releaseOrphans releases the orphaned assignments, then (with an
// abandonedReleaser) those answered as failed during an etcd outage.
func (r *Reconciler) releaseOrphans(ctx context.Context, orphans []AddressRelease, fixes map[string]int) []error {
	var errs []error
	for _, o := range orphans {
		log := r.Log.WithFields(logrus.Fields{"ip": o.IP.String(), "handle": o.Handle, "block": o.Block})
		if err := r.IPAM.ReleaseByHandle(ctx, o.Handle); err != nil {
			errs = append(errs, fmt.Errorf("releasing orphaned address %s: %w", o.IP, err))
			continue
		}
		fixes[FixOrphanReleased]++
		log.Info("reconcile: released an address no endpoint holds (neither in the datastore nor in Docker)")
	}
	if ab, ok := r.IPAM.(abandonedReleaser); ok {
		n, err := ab.ReleaseAbandoned(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing assignments answered as failed during an etcd outage: %w", err))
		}
		if n > 0 {
			fixes[FixOrphanReleased] += n
		}
	}
	return errs
}

// removeEndpoint undoes an endpoint Docker no longer has: veth and routes,
// its addresses, then the record (guarded by the revision the decision was
// made on, so a record that changed since is left for the next pass). The
// record goes last so that a failure half way is retried.
func (r *Reconciler) removeEndpoint(ctx context.Context, rm EndpointRemoval, fixes map[string]int) error {
	ep := rm.Endpoint
	log := r.Log.WithFields(logrus.Fields{"endpoint": dataplane.ShortID(ep.ID), "network": dataplane.ShortID(ep.Network), "ip": strings.Join(nonEmpty(ep.IPv4, ep.IPv6), ",")})
	if rm.RemoveVeth {
		if err := r.Dataplane.RemoveWorkload(ctx, ep.ID, endpointNets(ep)); err != nil {
			return fmt.Errorf("removing the veth of stale endpoint %s: %w", dataplane.ShortID(ep.ID), err)
		}
	} else {
		log.Warn("reconcile: a live Docker endpoint has the same interface name as this stale one: keeping the veth")
	}
	for _, rel := range rm.Release {
		if err := r.IPAM.ReleaseByHandle(ctx, rel.Handle); err != nil {
			return fmt.Errorf("releasing %s of stale endpoint %s: %w", rel.IP, dataplane.ShortID(ep.ID), err)
		}
		fixes[FixAddressReleased]++
		log.WithFields(logrus.Fields{"released": rel.IP.String(), "handle": rel.Handle}).Info("reconcile: released the address of an endpoint Docker no longer has")
	}
	for _, why := range rm.Kept {
		log.Warn("reconcile: not releasing an address of a stale endpoint: " + why)
	}
	err := r.Store.Txn(ctx, datastore.Delete(datastore.EndpointKey(ep.Node, ep.ID), rm.Rev))
	if errors.Is(err, datastore.ErrConflict) {
		log.Info("reconcile: stale endpoint record changed meanwhile: leaving it to the next pass")
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting stale endpoint record %s: %w", dataplane.ShortID(ep.ID), err)
	}
	fixes[FixEndpointRemoved]++
	log.WithField("joined", ep.Joined).Info("reconcile: removed an endpoint Docker no longer has (its container went while calico-cnm was down)")
	return nil
}

// ensureRoutes restores the missing host routes of a live endpoint.
func (r *Reconciler) ensureRoutes(ctx context.Context, ep datastore.Endpoint, dockerKnown bool, fixes map[string]int) error {
	log := r.Log.WithFields(logrus.Fields{"endpoint": dataplane.ShortID(ep.ID), "network": dataplane.ShortID(ep.Network), "interface": ep.HostIfName})
	missing, err := r.Dataplane.MissingWorkloadRoutes(ctx, ep.HostIfName, endpointNets(ep))
	if errors.Is(err, dataplane.ErrNoInterface) {
		if dockerKnown && r.firstWarning("noveth/"+ep.ID) {
			log.Warn("reconcile: the veth of a joined endpoint Docker still has is missing: its container has no connectivity until it is restarted")
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		return nil
	}
	if err := r.Dataplane.EnsureWorkloadRoutes(ctx, ep.HostIfName, missing); err != nil {
		return err
	}
	for _, m := range missing {
		fixes[FixRouteRestored]++
		log.WithField("ip", m.IP.String()).Info("reconcile: restored a missing host route")
	}
	return nil
}

// Run passes at once, then every Interval, shortly after Docker events, and
// when pending candidates mature, until ctx is done.
func (r *Reconciler) Run(ctx context.Context) {
	interval := r.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	var changes <-chan struct{}
	if r.Docker != nil {
		changes = r.Docker.Changes(ctx)
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	followUp := time.NewTimer(time.Hour)
	followUp.Stop()
	defer followUp.Stop()
	var debounce <-chan time.Time
	var lastPass time.Time
	// followUpArmed mirrors followUp (a timer cannot be asked).
	followUpArmed, reported := false, false
	report := func() {
		if due := debounce != nil || followUpArmed; due != reported {
			reported = due
			r.scheduled(due)
		}
	}

	pass := func(trigger string) {
		lastPass = time.Now()
		r.Log.WithField("trigger", trigger).Debug("reconcile pass")
		res, err := r.Pass(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.Log.WithError(err).Warn("reconcile pass incomplete")
		}
		if n := res.Plan.Actions(); n > 0 || len(res.Fixes) > 0 {
			r.Log.WithField("fixes", res.Fixes).Info("reconcile pass done")
		}
		// A follow-up armed by an earlier pass is for candidates this pass
		// judged again: left armed, it would run a pass with nothing due
		// (an idle host's datastore read, a burst of starts after).
		followUp.Stop()
		followUpArmed = false
		// Only while Docker answers: otherwise due candidates would make
		// this a busy loop, and the ticker retries anyway.
		if res.DockerKnown && !res.Plan.NextDue.IsZero() {
			followUp.Reset(max(time.Until(res.Plan.NextDue)+100*time.Millisecond, minFollowUp))
			followUpArmed = true
		}
	}
	pass(PassAtStart)
	for {
		report()
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			pass(PassPeriodic)
		case <-followUp.C:
			followUpArmed = false
			pass(PassFollowUp)
		case _, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			if debounce == nil {
				debounce = time.After(max(eventDebounce, time.Until(lastPass.Add(minEventGap))))
			}
		case <-debounce:
			debounce = nil
			pass(PassDockerEvent)
		case _, ok := <-r.Kick:
			if !ok {
				r.Kick = nil
				continue
			}
			pass(PassKicked)
		}
	}
}

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// secondSighting is firstWarning for a problem a single pass can see
// falsely: an endpoint Docker created between the pass's datastore read
// and its Docker read (the order readInput needs) is unknown to that pass
// only, and a busy host starting containers has one in many passes. True
// on the second pass in a row that sees the problem, and not again while
// it lasts.
func (r *Reconciler) secondSighting(key string) bool {
	seen := "seen/" + key
	r.stillBad[seen] = true
	if !r.warned[seen] {
		return false
	}
	return r.firstWarning(key)
}

// firstWarning records a problem seen by this pass and reports whether the
// last pass had not seen it already.
func (r *Reconciler) firstWarning(key string) bool {
	r.stillBad[key] = true
	return !r.warned[key]
}
