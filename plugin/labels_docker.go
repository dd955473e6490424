package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/policy"
)

// dockerLabels is driver.Labeller over the Docker API: it tells which
// container is joining an endpoint and computes its policy labels, from a
// view of Docker's containers that Docker's events keep current (no
// polling: one listing when the event stream is opened, then events).
//
// Join runs while dockerd holds the container's lock (container start and
// network connect both do), so inspecting that container would wait for
// our own answer. What Docker offers without that lock:
//   - the container create event carries the container's name and labels;
//     the listing says which networks a created container asks for;
//   - the network's endpoint list (network inspect) names the joining
//     endpoint after its container, from CreateEndpoint on;
//   - Join's options carry the sandbox's port map and exposed ports;
//   - the network connect event follows Join with the container's id.
//
// At Join the network's endpoint list names the container: exact, also
// for a running container being connected (a lone container starting on
// the network would not be: a running one may be the one joining). When
// Docker cannot say (an error), the candidates decide: the containers
// starting on the network, narrowed by the sandbox's ports where known;
// one candidate is taken; candidates whose labels are all the same give
// those labels (less the container's name, which the network connect
// event adds); otherwise the endpoint fails closed until that event.
type dockerLabels struct {
	cli   dockerAPI
	store labelStore
	node  string
	log   logrus.FieldLogger
	cache *containerCache

	// ready is closed once the first listing is in the cache.
	ready     chan struct{}
	readyOnce sync.Once

	mu sync.Mutex
	// pending are this node's joined endpoints whose labels are unknown
	// or incomplete (endpoint id -> network id), for the connect event.
	pending map[string]string
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
}

func newDockerLabels(cli dockerAPI, store labelStore, node string, log logrus.FieldLogger) *dockerLabels {
	return &dockerLabels{cli: cli, store: store, node: node, log: log, cache: newContainerCache(),
		ready: make(chan struct{}), pending: map[string]string{}}
}

// ErrLabelsUnknown: the joining container could not be identified.
var ErrLabelsUnknown = errors.New("cannot tell which container is joining")

const (
	// createEventWait bounds how long a Join named by the network's
	// endpoint list waits for its container's create event (the event is
	// sent before the start that joins, so it is normally in already).
	createEventWait = time.Second
)

// EndpointLabels implements driver.Labeller.
func (d *dockerLabels) EndpointLabels(ctx context.Context, req driver.LabelRequest) (map[string]string, error) {
	select {
	case <-d.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: Docker's containers are not listed yet: %w", ErrLabelsUnknown, ctx.Err())
	}
	name := d.networkName(ctx, req.NetworkID)
	log := d.log.WithFields(logrus.Fields{"network": shortID(req.NetworkID), "endpoint": shortID(req.EndpointID)})
	c, err := d.identify(ctx, req.NetworkID, req.EndpointID)
	if err == nil {
		log.WithField("container", c.Name).Debug("the network's endpoint list names the joining container")
		return policy.WithDriverLabels(c.labelsOn(name), req.DriverLabels), nil
	}
	cands, complete := candidates(d.cache.all(), req.NetworkID, name, joinPorts(req.Options))
	if complete && len(cands) == 1 {
		log.WithError(err).WithField("container", cands[0].Name).Info("joining container not named by Docker: the only container starting on the network is taken")
		return policy.WithDriverLabels(cands[0].labelsOn(name), req.DriverLabels), nil
	}
	d.setPending(req.EndpointID, req.NetworkID)
	if l, ok := commonLabels(cands, name); ok && complete {
		log.WithError(err).WithField("candidates", len(cands)).Info("joining container not named by Docker: its labels are those of every candidate (its name comes with the connect event)")
		return policy.WithDriverLabels(l, req.DriverLabels), nil
	}
	if len(req.DriverLabels) > 0 {
		log.WithError(err).Info("joining container not named by Docker: the endpoint has its driver-option labels (the container's come with the connect event)")
		return policy.WithDriverLabels(policy.EndpointLabels(nil, "", name), req.DriverLabels), nil
	}
	return nil, fmt.Errorf("%w: %d candidates on network %s: %w", ErrLabelsUnknown, len(cands), shortID(req.NetworkID), err)
}

// Relearn learns the labels of a joined endpoint that has none (its
// record was rebuilt by reconcile after the datastore lost it): Docker's
// endpoint list names its container. One not named stays pending for the
// next connect event or listing.
func (d *dockerLabels) Relearn(ctx context.Context, endpointID, networkID string) {
	d.setPending(endpointID, networkID)
	c, err := d.identify(ctx, networkID, endpointID)
	if err != nil {
		d.log.WithError(err).WithFields(logrus.Fields{"endpoint": shortID(endpointID), "network": shortID(networkID)}).
			Info("the container of a rebuilt endpoint is not named by Docker yet: its labels come with the next event")
		return
	}
	d.learn(ctx, endpointID, c.labelsOn(d.networkName(ctx, networkID)))
}

// identify finds the container of an endpoint from the network's endpoint
// list, which names each endpoint after its container (by id once joined)
// from CreateEndpoint on, and waits (bounded) for its create event.
func (d *dockerLabels) identify(ctx context.Context, networkID, endpointID string) (knownContainer, error) {
	nw, err := d.cli.NetworkInspect(ctx, networkID, network.InspectOptions{})
	if err != nil {
		return knownContainer{}, fmt.Errorf("inspecting network %s: %w", shortID(networkID), err)
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
	if id == "" && name == "" {
		return knownContainer{}, fmt.Errorf("network %s does not list endpoint %s", shortID(networkID), shortID(endpointID))
	}
	wctx, cancel := context.WithTimeout(ctx, createEventWait)
	defer cancel()
	c, err := d.cache.waitFor(wctx, func(c knownContainer) bool { return c.ID == id || id == "" && c.Name == name })
	if err == nil {
		return c, nil
	}
	// No event for it (yet): Docker's listing of that name, which takes
	// no container lock.
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		return knownContainer{}, fmt.Errorf("listing container %s: %w", name, err)
	}
	for _, s := range list {
		if c := fromSummary(s); c.ID == id || id == "" && c.Name == name {
			return c, nil
		}
	}
	return knownContainer{}, fmt.Errorf("no container %q", name)
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
	d.pending[endpointID] = networkID
}

// pendingOn are the pending endpoints of a network.
func (d *dockerLabels) pendingOn(networkID string) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out map[string]bool
	for ep, n := range d.pending {
		if n == networkID {
			if out == nil {
				out = map[string]bool{}
			}
			out[ep] = true
		}
	}
	return out
}

func (d *dockerLabels) forget(endpointID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, endpointID)
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
// redone. Nothing is polled.
func (d *dockerLabels) Run(ctx context.Context) {
	backoff := retry.New(retry.Standard())
	for {
		listed, err := d.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if listed {
			backoff.Reset()
		}
		d.log.WithError(err).Info("following Docker's events: opening the stream again")
		if !backoff.Wait(ctx) {
			return
		}
	}
}

// follow opens the event stream from a moment before the listing (Docker
// replays the events since then: none between the listing and the stream
// is missed, a replayed one changes nothing), lists, and applies events
// until the stream breaks. listed: the listing was taken.
func (d *dockerLabels) follow(ctx context.Context) (listed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	since := time.Now().Add(-time.Second)
	msgs, errs := d.cli.Events(ctx, events.ListOptions{Since: fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()), Filters: learnerEvents()})
	lctx, lcancel := context.WithTimeout(ctx, dockerCallTimeout)
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
	d.readyOnce.Do(func() { close(d.ready) })
	if err := d.learnFromListing(ctx, list); err != nil && ctx.Err() == nil {
		d.log.WithError(err).Info("learning the labels of endpoints joined with unknown labels")
	}
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-errs:
			return true, err
		case m := <-msgs:
			d.handle(ctx, m)
		}
	}
}

// handle applies one event.
func (d *dockerLabels) handle(ctx context.Context, m events.Message) {
	attrs := m.Actor.Attributes
	switch m.Type {
	case events.ContainerEventType:
		id := m.Actor.ID
		switch m.Action {
		case events.ActionCreate:
			d.cache.update(id, func(c *knownContainer) bool {
				c.Name, c.Labels, c.Running, c.Networks, c.Ports = attrs["name"], labelsOfEvent(attrs), false, nil, nil
				return true
			})
			// The networks it asks for are in the listing, not the event.
			go d.describe(ctx, id)
		case events.ActionStart, events.ActionDie:
			if _, ok := d.cache.get(id); !ok {
				go d.describe(ctx, id)
				return
			}
			d.cache.update(id, func(c *knownContainer) bool {
				c.Running = m.Action == events.ActionStart
				return true
			})
		case events.ActionRename:
			d.cache.update(id, func(c *knownContainer) bool {
				c.Name = attrs["name"]
				return true
			})
		case events.ActionDestroy:
			d.cache.update(id, func(*knownContainer) bool { return false })
		}
	case events.NetworkEventType:
		// Only a network with pending endpoints is looked at: no need to
		// know the name Docker gives this driver.
		if m.Action == events.ActionConnect {
			d.connected(ctx, m.Actor.ID, attrs["name"], attrs["container"])
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
// networks; its ports once started).
func (d *dockerLabels) describe(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, dockerCallTimeout)
	defer cancel()
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("id", id))})
	if err != nil {
		d.log.WithError(err).WithField("container", shortID(id)).Debug("listing a container")
		return
	}
	for _, s := range list {
		if s.ID != id {
			continue
		}
		got := fromSummary(s)
		d.cache.update(id, func(c *knownContainer) bool {
			// The events since are newer than this listing: it only
			// fills in what they do not say.
			if c.Name == "" {
				c.Name, c.Labels, c.Running = got.Name, got.Labels, got.Running
			}
			c.Networks = got.Networks
			if got.Ports != nil {
				c.Ports = got.Ports
			}
			return true
		})
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
	ctx, cancel := context.WithTimeout(ctx, dockerCallTimeout)
	defer cancel()
	nw, err := d.cli.NetworkInspect(ctx, networkID, network.InspectOptions{})
	if err != nil {
		d.log.WithError(err).WithField("network", shortID(networkID)).Info("inspecting the network of a connect event")
		return
	}
	r, ok := nw.Containers[containerID]
	if !ok || !pend[r.EndpointID] {
		return
	}
	c, ok := d.cache.get(containerID)
	if !ok {
		return
	}
	d.learn(ctx, r.EndpointID, c.labelsOn(networkName))
}

// learnFromListing gives this node's endpoints whose labels were not
// known at Join (by this run, or before a restart) those of the container
// the listing shows holding them.
func (d *dockerLabels) learnFromListing(ctx context.Context, list []container.Summary) error {
	ctx, cancel := context.WithTimeout(ctx, dockerCallTimeout)
	defer cancel()
	kvs, err := d.store.List(ctx, datastore.EndpointsPrefix+d.node+"/")
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) == nil && ep.Joined && ep.LabelsUnknown {
			d.setPending(ep.ID, ep.Network)
		}
	}
	d.mu.Lock()
	pending := maps.Clone(d.pending)
	d.mu.Unlock()
	for _, s := range list {
		if s.NetworkSettings == nil {
			continue
		}
		c := fromSummary(s)
		for netName, es := range s.NetworkSettings.Networks {
			if es == nil || pending[es.EndpointID] == "" {
				continue
			}
			d.learn(ctx, es.EndpointID, c.labelsOn(netName))
		}
	}
	return nil
}

// learn records the labels of a joined endpoint (with its driver-option
// labels), guarded: a Leave or another Join since the read wins.
func (d *dockerLabels) learn(ctx context.Context, endpointID string, labels map[string]string) {
	log := d.log.WithField("endpoint", shortID(endpointID))
	key := datastore.EndpointKey(d.node, endpointID)
	var ep datastore.Endpoint
	rev, err := d.store.GetJSON(ctx, key, &ep)
	if err != nil || !ep.Joined {
		d.forget(endpointID)
		return
	}
	labels = policy.WithDriverLabels(labels, ep.DriverLabels)
	if !ep.LabelsUnknown && maps.Equal(ep.Labels, labels) {
		d.forget(endpointID)
		return
	}
	ep.Labels, ep.LabelsUnknown = labels, false
	if err := d.store.Txn(ctx, datastore.Update(key, datastore.MustJSON(ep), rev)); err != nil {
		log.WithError(err).Info("recording the learnt labels of an endpoint")
		return
	}
	d.forget(endpointID)
	log.WithField("labels", labels).Info("learnt the labels of an endpoint joined without them")
}
