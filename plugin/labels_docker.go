package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/internal/dockerapi"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/policy"
)

// dockerLabels is driver.Labeller over the Docker API: it tells which
// container is joining an endpoint and computes its policy labels, from a
// view of Docker's containers that Docker's events keep current (one
// listing when the event stream is opened, then events; endpoints whose
// labels are unknown or unverified are retried with backoff, and only
// while there are some).
//
// Join runs while dockerd holds the container's lock (container start and
// network connect both do), so inspecting that container would wait for
// our own answer. What Docker offers without that lock:
//   - the network's endpoint list (network inspect) names the joining
//     endpoint after its container, from CreateEndpoint on: by id once
//     joined, by name before;
//   - Docker's listing of containers (by id or name) gives a container's
//     id, name, labels and networks;
//   - Join's options carry the sandbox's port map and exposed ports;
//   - the network connect event follows Join with the container's id.
//
// At Join the network's endpoint list names the container, and Docker's
// listing of that id or name gives its labels: exact, also for a running
// container being connected. When Docker cannot say (an error), the
// candidates of a current view decide: the containers starting on the
// network, narrowed by the sandbox's ports where known; one candidate is
// taken; candidates whose labels are all the same give those labels (less
// the container's name); otherwise the endpoint fails closed. Either way
// the endpoint stays pending until the connect event (or a retry) checks
// it against the container Docker then names.
type dockerLabels struct {
	cli   dockerAPI
	store labelStore
	node  string
	log   logrus.FieldLogger
	cache *containerCache

	// ready is closed once the first listing is in the cache.
	ready     chan struct{}
	readyOnce sync.Once
	// kick wakes the retry loop when an endpoint becomes pending.
	kick chan struct{}
	// work are the goroutines an event started (listings, learning);
	// Run waits for them.
	work sync.WaitGroup

	mu sync.Mutex
	// pending are this node's endpoints whose labels are unknown or not
	// verified yet, for the connect event and the retries.
	pending map[string]pendingEndpoint
	// current: the view follows a live event stream. While it does not
	// (the stream broke, dockerd restarting) a container may have died or
	// gone without the view knowing: no candidate is guessed from it.
	current bool
}

// pendingEndpoint is a pending endpoint's network and since when it is.
type pendingEndpoint struct {
	network string
	since   time.Time
}

// dockerAPI is the part of the Docker client the label learner uses.
type dockerAPI interface {
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	NetworkInspect(ctx context.Context, networkID string, options network.InspectOptions) (network.Inspect, error)
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
}

// labelStore is the part of the datastore the label learner uses.
type labelStore interface {
	GetJSON(ctx context.Context, key string, out any) (int64, error)
	List(ctx context.Context, prefix string) ([]datastore.KV, error)
	Txn(ctx context.Context, ops ...datastore.Op) error
	Retry(ctx context.Context, fn func(ctx context.Context) error) error
}

func newDockerLabels(cli dockerAPI, store labelStore, node string, log logrus.FieldLogger) *dockerLabels {
	return &dockerLabels{cli: cli, store: store, node: node, log: log, cache: newContainerCache(),
		ready: make(chan struct{}), kick: make(chan struct{}, 1), pending: map[string]pendingEndpoint{}}
}

// ErrLabelsUnknown: the joining container could not be identified.
var ErrLabelsUnknown = errors.New("cannot tell which container is joining")

// errNotListed: the network does not list the endpoint (it left, or its
// Join failed and Docker deleted it).
var errNotListed = errors.New("the network does not list the endpoint")

// errNotJoined: the endpoint has no joined record on this node.
var errNotJoined = errors.New("the endpoint is not joined here")

const (
	// pendingGrace is how long a pending endpoint without a joined
	// record is kept: its Join may not have written the record yet.
	pendingGrace = time.Minute
	// streamStable is how long an event stream without events must stay
	// up for its reopening backoff to start over (a stream that breaks at
	// once is reopened ever more slowly).
	streamStable = 10 * time.Second
)

// EndpointLabels implements driver.Labeller.
func (d *dockerLabels) EndpointLabels(ctx context.Context, req driver.LabelRequest) (map[string]string, error) {
	select {
	case <-d.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: Docker's containers are not listed yet: %w", ErrLabelsUnknown, ctx.Err())
	}
	labels, err := d.joinLabels(ctx, req)
	if err != nil {
		return nil, err
	}
	return policy.WithDriverLabels(labels, req.DriverLabels), nil
}

// joinLabels are the container's labels of a joining endpoint.
func (d *dockerLabels) joinLabels(ctx context.Context, req driver.LabelRequest) (map[string]string, error) {
	name := d.networkName(ctx, req.NetworkID)
	log := d.log.WithFields(logrus.Fields{"network": dataplane.ShortID(req.NetworkID), "endpoint": dataplane.ShortID(req.EndpointID)})
	c, err := d.identify(ctx, req.NetworkID, req.EndpointID)
	if err == nil {
		log.WithField("container", c.Name).Debug("the network's endpoint list names the joining container")
		return c.labelsOn(name), nil
	}
	// Whatever is guessed is checked against the container Docker names
	// later (the connect event, a retry).
	d.setPending(req.EndpointID, req.NetworkID)
	if !d.isCurrent() {
		return nil, fmt.Errorf("%w: Docker's event stream is down, so the view of its containers may be stale: %w", ErrLabelsUnknown, err)
	}
	cands, complete := candidates(d.cache.all(), req.NetworkID, name, joinPorts(req.Options))
	if complete && len(cands) == 1 {
		log.WithError(err).WithField("container", cands[0].Name).Info("joining container not named by Docker: the only container starting on the network is taken until the connect event confirms it")
		return cands[0].labelsOn(name), nil
	}
	if l, ok := commonLabels(cands, name); ok && complete {
		log.WithError(err).WithField("candidates", len(cands)).Info("joining container not named by Docker: its labels are those of every candidate (its name comes with the connect event)")
		return l, nil
	}
	return nil, fmt.Errorf("%w: %d candidates on network %s: %w", ErrLabelsUnknown, len(cands), dataplane.ShortID(req.NetworkID), err)
}

// Relearn learns the labels of a joined endpoint that has none (its
// record was rebuilt by reconcile after the datastore lost it): Docker's
// endpoint list names its container. One not named stays pending for the
// next connect event or retry.
func (d *dockerLabels) Relearn(ctx context.Context, endpointID, networkID string) {
	d.setPending(endpointID, networkID)
	if err := d.verify(ctx, endpointID, networkID); err != nil {
		d.log.WithError(err).WithFields(logrus.Fields{"endpoint": dataplane.ShortID(endpointID), "network": dataplane.ShortID(networkID)}).
			Info("the container of a rebuilt endpoint is not named by Docker yet: its labels come with the next event or retry")
	}
}

// verify learns a pending endpoint's labels from the container Docker
// names for it now; an endpoint the network no longer lists is dropped.
func (d *dockerLabels) verify(ctx context.Context, endpointID, networkID string) error {
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	c, err := d.identify(ctx, networkID, endpointID)
	if errors.Is(err, errNotListed) {
		d.forget(endpointID)
		return err
	}
	if err != nil {
		return err
	}
	return d.learn(ctx, endpointID, c.labelsOn(d.networkName(ctx, networkID)))
}

// identify finds the container of an endpoint: the network's endpoint
// list names it (by id once joined, by name from CreateEndpoint on), and
// Docker's listing of that id or name gives it. A name is asked of Docker
// every time: the view may still hold an older container of that name
// (removed, renamed or recreated since, its event not in yet).
func (d *dockerLabels) identify(ctx context.Context, networkID, endpointID string) (knownContainer, error) {
	nw, err := d.cli.NetworkInspect(ctx, networkID, network.InspectOptions{})
	if err != nil {
		return knownContainer{}, fmt.Errorf("inspecting network %s: %w", dataplane.ShortID(networkID), err)
	}
	id, name := "", ""
	for key, r := range nw.Containers {
		if r.EndpointID == endpointID {
			name = r.Name
			if !strings.HasPrefix(key, "ep-") {
				id = key
			}
		}
	}
	switch {
	case id != "":
		return d.container(ctx, id)
	case name != "":
		return d.containerNamed(ctx, name)
	}
	return knownContainer{}, fmt.Errorf("network %s, endpoint %s: %w", dataplane.ShortID(networkID), dataplane.ShortID(endpointID), errNotListed)
}

// container is the container id: from the view, else Docker's listing.
func (d *dockerLabels) container(ctx context.Context, id string) (knownContainer, error) {
	if c, ok := d.cache.get(id); ok {
		return c, nil
	}
	list, err := d.list(ctx, "id", id)
	if err != nil {
		return knownContainer{}, err
	}
	for _, s := range list {
		if s.ID == id {
			return fromSummary(s), nil
		}
	}
	return knownContainer{}, fmt.Errorf("no container %s", dataplane.ShortID(id))
}

// containerNamed is the container Docker names name now (its name
// filter matches substrings: the exact name is picked).
func (d *dockerLabels) containerNamed(ctx context.Context, name string) (knownContainer, error) {
	list, err := d.list(ctx, "name", name)
	if err != nil {
		return knownContainer{}, err
	}
	for _, s := range list {
		if slices.Contains(s.Names, "/"+name) {
			c := fromSummary(s)
			c.Name = name
			return c, nil
		}
	}
	return knownContainer{}, fmt.Errorf("no container %q", name)
}

// list is Docker's listing of the containers a filter matches.
func (d *dockerLabels) list(ctx context.Context, filter, value string) ([]container.Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg(filter, value))})
	if err != nil {
		return nil, fmt.Errorf("listing container %s=%s: %w", filter, value, err)
	}
	return list, nil
}

// networkName is the Docker network's name: from its record, else asked
// (network inspect takes no lock a Join holds).
func (d *dockerLabels) networkName(ctx context.Context, id string) string {
	var n datastore.Network
	if _, err := d.store.GetJSON(ctx, datastore.NetworkKey(id), &n); err == nil && n.Name != "" {
		return n.Name
	}
	nw, err := d.cli.NetworkInspect(ctx, id, network.InspectOptions{})
	if err != nil || nw.ID != id {
		return ""
	}
	return nw.Name
}

func (d *dockerLabels) setPending(endpointID, networkID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p, ok := d.pending[endpointID]; !ok || p.network != networkID {
		d.pending[endpointID] = pendingEndpoint{network: networkID, since: time.Now()}
	}
	select {
	case d.kick <- struct{}{}:
	default: // the retry loop is woken already
	}
}

// pendingOn are the pending endpoints of a network.
func (d *dockerLabels) pendingOn(networkID string) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out map[string]bool
	for ep, p := range d.pending {
		if p.network == networkID {
			if out == nil {
				out = map[string]bool{}
			}
			out[ep] = true
		}
	}
	return out
}

// pendingNow is a copy of the pending endpoints.
func (d *dockerLabels) pendingNow() map[string]pendingEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.pending)
}

func (d *dockerLabels) forget(endpointID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, endpointID)
}

// forgetIfStale forgets a pending endpoint without a joined record once
// its Join had all the time to write one.
func (d *dockerLabels) forgetIfStale(endpointID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p, ok := d.pending[endpointID]; ok && time.Since(p.since) > pendingGrace {
		delete(d.pending, endpointID)
	}
}

func (d *dockerLabels) setCurrent(current bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.current = current
}

func (d *dockerLabels) isCurrent() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.current
}

// spawn runs f in a goroutine Run waits for.
func (d *dockerLabels) spawn(ctx context.Context, f func(ctx context.Context)) {
	d.work.Add(1)
	go func() {
		defer d.work.Done()
		f(ctx)
	}()
}

// learnerEvents are the Docker events the learner follows.
func learnerEvents() filters.Args {
	return filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("type", string(events.NetworkEventType)),
		filters.Arg("event", string(events.ActionCreate)),
		filters.Arg("event", string(events.ActionStart)),
		filters.Arg("event", string(events.ActionDie)),
		filters.Arg("event", string(events.ActionDestroy)),
		filters.Arg("event", string(events.ActionRename)),
		filters.Arg("event", string(events.ActionConnect)),
	)
}

// Run keeps the view of Docker's containers until ctx ends: it opens
// Docker's event stream, lists the containers once, then follows the
// events; a broken stream is opened again (with backoff) and the listing
// redone. Pending endpoints are retried while there are some.
func (d *dockerLabels) Run(ctx context.Context) {
	defer d.work.Wait()
	d.spawn(ctx, d.retryPending)
	backoff := retry.New(retry.Standard())
	for {
		healthy, err := d.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if healthy {
			backoff.Reset()
		}
		d.log.WithError(err).Info("following Docker's events: opening the stream again")
		if !backoff.Wait(ctx) {
			return
		}
	}
}

// retryPending retries the pending endpoints with backoff while there
// are some; with none it waits for one (nothing is polled).
func (d *dockerLabels) retryPending(ctx context.Context) {
	backoff := retry.New(retry.Standard())
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
		}
		backoff.Reset()
		for len(d.pendingNow()) > 0 {
			if !backoff.Wait(ctx) {
				return
			}
			for ep, p := range d.pendingNow() {
				if err := d.verify(ctx, ep, p.network); err != nil && ctx.Err() == nil {
					d.log.WithError(err).WithFields(logrus.Fields{"endpoint": dataplane.ShortID(ep), "network": dataplane.ShortID(p.network)}).Debug("a pending endpoint stays pending")
				}
			}
		}
	}
}

// follow opens the event stream from a moment before the listing (Docker
// replays the events since then: none between the listing and the stream
// is missed, a replayed one changes nothing), lists, and applies events
// until the stream breaks. healthy: a live event came, or the stream
// stayed up streamStable.
func (d *dockerLabels) follow(ctx context.Context) (healthy bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opened := time.Now()
	defer func() { healthy = healthy || time.Since(opened) >= streamStable }()
	defer d.setCurrent(false)
	since := opened.Add(-time.Second)
	msgs, errs := d.cli.Events(ctx, events.ListOptions{Since: fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()), Filters: learnerEvents()})
	lctx, lcancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	list, err := d.cli.ContainerList(lctx, container.ListOptions{All: true})
	lcancel()
	if err != nil {
		return false, fmt.Errorf("listing Docker's containers: %w", err)
	}
	cs := make([]knownContainer, 0, len(list))
	for _, s := range list {
		cs = append(cs, fromSummary(s))
	}
	d.cache.reset(cs)
	d.setCurrent(true)
	d.readyOnce.Do(func() { close(d.ready) })
	if err := d.learnFromListing(ctx, list); err != nil && ctx.Err() == nil {
		d.log.WithError(err).Info("learning the labels of endpoints joined with unknown labels")
	}
	for {
		select {
		case <-ctx.Done():
			return healthy, ctx.Err()
		case err := <-errs:
			return healthy, err
		case m := <-msgs:
			// A replayed event says nothing of this stream.
			healthy = healthy || m.TimeNano > opened.UnixNano()
			d.handle(ctx, m)
		}
	}
}

// handle applies one event. What needs Docker or the datastore runs in a
// goroutine: the stream is not held up.
func (d *dockerLabels) handle(ctx context.Context, m events.Message) {
	attrs := m.Actor.Attributes
	switch m.Type {
	case events.ContainerEventType:
		id := m.Actor.ID
		switch m.Action {
		case events.ActionCreate:
			d.cache.set(knownContainer{ID: id, Name: attrs["name"], Labels: labelsOfEvent(attrs)})
			// The networks it asks for are in the listing, not the event.
			d.describe(ctx, id, false)
		case events.ActionStart, events.ActionDie:
			running := m.Action == events.ActionStart
			if !d.cache.update(id, func(c *knownContainer) { c.Running = running }) {
				d.describe(ctx, id, true)
			}
		case events.ActionRename:
			d.cache.update(id, func(c *knownContainer) { c.Name = attrs["name"] })
			d.spawn(ctx, func(ctx context.Context) { d.renamed(ctx, id) })
		case events.ActionDestroy:
			d.cache.remove(id)
		}
	case events.NetworkEventType:
		// Only a network with pending endpoints is looked at: no need to
		// know the name Docker gives this driver.
		if m.Action == events.ActionConnect && len(d.pendingOn(m.Actor.ID)) > 0 {
			d.spawn(ctx, func(ctx context.Context) { d.connected(ctx, m.Actor.ID, attrs["name"], attrs["container"]) })
		}
	}
}

// labelsOfEvent are a container event's attributes less the two Docker
// adds (the rest are the container's labels).
func labelsOfEvent(attrs map[string]string) map[string]string {
	out := maps.Clone(attrs)
	delete(out, "name")
	delete(out, "image")
	return out
}

// describe adds what Docker's listing says of one container (its
// networks; its ports once started), in a goroutine. mayAdd: the
// container is not in the view (an event of one the listing missed) and
// is added, unless it is destroyed meanwhile.
func (d *dockerLabels) describe(ctx context.Context, id string, mayAdd bool) {
	d.cache.describing(id)
	d.spawn(ctx, func(ctx context.Context) {
		list, err := d.list(ctx, "id", id)
		if err != nil {
			d.log.WithError(err).WithField("container", dataplane.ShortID(id)).Debug("listing a container")
		}
		var got *knownContainer
		for _, s := range list {
			if s.ID == id {
				c := fromSummary(s)
				got = &c
			}
		}
		d.cache.described(id, got, mayAdd)
	})
}

// renamed gives this node's endpoints of a renamed container its new
// name (the label projectcalico.org/container).
func (d *dockerLabels) renamed(ctx context.Context, id string) {
	list, err := d.list(ctx, "id", id)
	if err == nil {
		err = d.learnListed(ctx, list, func(string) bool { return true })
	}
	if err != nil && ctx.Err() == nil {
		d.log.WithError(err).WithField("container", dataplane.ShortID(id)).Info("relabelling the endpoints of a renamed container")
	}
}

// connected follows a network connect event: the container joined (the
// network's endpoint list names it by id now); a pending endpoint of it
// gets its labels.
func (d *dockerLabels) connected(ctx context.Context, networkID, networkName, containerID string) {
	pend := d.pendingOn(networkID)
	if len(pend) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	nw, err := d.cli.NetworkInspect(ctx, networkID, network.InspectOptions{})
	if err != nil {
		d.log.WithError(err).WithField("network", dataplane.ShortID(networkID)).Info("inspecting the network of a connect event")
		return
	}
	d.dropUnlisted(pend, nw)
	r, ok := nw.Containers[containerID]
	if !ok || !pend[r.EndpointID] {
		return
	}
	c, err := d.container(ctx, containerID)
	if err == nil {
		err = d.learn(ctx, r.EndpointID, c.labelsOn(networkName))
	}
	if err != nil && ctx.Err() == nil {
		d.log.WithError(err).WithField("endpoint", dataplane.ShortID(r.EndpointID)).Info("learning the labels of a connected endpoint: retried")
	}
}

// dropUnlisted forgets the pending endpoints of a network that its
// endpoint list no longer names (left, or their Join failed).
func (d *dockerLabels) dropUnlisted(pend map[string]bool, nw network.Inspect) {
	listed := make(map[string]bool, len(nw.Containers))
	for _, r := range nw.Containers {
		listed[r.EndpointID] = true
	}
	for ep := range pend {
		if !listed[ep] {
			d.forget(ep)
		}
	}
}

// learnFromListing gives this node's endpoints whose labels were not
// known at Join (by this run, or before a restart) those of the container
// the listing shows holding them.
func (d *dockerLabels) learnFromListing(ctx context.Context, list []container.Summary) error {
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	kvs, err := d.store.List(ctx, datastore.EndpointsPrefix+d.node+"/")
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		if ep, err := datastore.ParseEndpoint(kv.Key, kv.Value); err == nil && ep.Joined && ep.LabelsUnknown {
			d.setPending(ep.ID, ep.Network)
		}
	}
	pending := d.pendingNow()
	return d.learnListed(ctx, list, func(ep string) bool { _, ok := pending[ep]; return ok })
}

// learnListed gives the endpoints want picks of the listed containers
// those containers' labels.
func (d *dockerLabels) learnListed(ctx context.Context, list []container.Summary, want func(endpointID string) bool) error {
	var errs []error
	for _, s := range list {
		if s.NetworkSettings == nil {
			continue
		}
		c := fromSummary(s)
		for netName, es := range s.NetworkSettings.Networks {
			if es == nil || es.EndpointID == "" || !want(es.EndpointID) {
				continue
			}
			if err := d.learn(ctx, es.EndpointID, c.labelsOn(netName)); err != nil && !errors.Is(err, errNotJoined) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// learn records the labels of a joined endpoint (with its driver-option
// labels), guarded: a Leave or another Join since the read wins. A
// conflict is read again; the endpoint stays pending when recording
// fails.
func (d *dockerLabels) learn(ctx context.Context, endpointID string, labels map[string]string) error {
	key := datastore.EndpointKey(d.node, endpointID)
	changed := false
	err := d.store.Retry(ctx, func(ctx context.Context) error {
		var ep datastore.Endpoint
		rev, err := d.store.GetJSON(ctx, key, &ep)
		if errors.Is(err, datastore.ErrNotFound) || err == nil && !ep.Joined {
			return errNotJoined
		}
		if err != nil {
			return err
		}
		all := policy.WithDriverLabels(labels, ep.DriverLabels)
		if !ep.LabelsUnknown && maps.Equal(ep.Labels, all) {
			return nil
		}
		ep.Labels, ep.LabelsUnknown = all, false
		changed = true
		return d.store.Txn(ctx, datastore.Update(key, datastore.MustJSON(ep), rev))
	})
	switch {
	case errors.Is(err, errNotJoined):
		d.forgetIfStale(endpointID)
		return err
	case err != nil:
		return fmt.Errorf("recording the labels of endpoint %s: %w", dataplane.ShortID(endpointID), err)
	}
	d.forget(endpointID)
	if changed {
		d.log.WithFields(logrus.Fields{"endpoint": dataplane.ShortID(endpointID), "labels": labels}).Info("learnt the labels of an endpoint joined without them (or with a guess)")
	}
	return nil
}
