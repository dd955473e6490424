package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"

	"github.com/docker/docker/api/types/container"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/ports"
)

// knownContainer is what the label learner knows of one Docker container,
// from Docker's listing and its events.
type knownContainer struct {
	ID   string
	Name string // without Docker's "/"
	// Labels are the container's Docker labels.
	Labels map[string]string
	// Networks are the networks it asks for (names or ids, as Docker
	// lists them); nil while not known (a create event names none).
	Networks []string
	// Running: started (its Joins are done); a created, exited or
	// restarting container may be joining.
	Running bool
	// Ports are its exposed and published container ports ("80/tcp");
	// nil while not known.
	Ports portSet
}

// portSet is a set of container ports, "80/tcp".
type portSet map[string]bool

// labelsOn are the container's endpoint labels on the named network.
func (c knownContainer) labelsOn(network string) map[string]string {
	return policy.EndpointLabels(c.Labels, c.Name, network)
}

// asksFor: the container asked for the network (by name, id or short id).
func (c knownContainer) asksFor(id, name string) bool {
	for _, s := range c.Networks {
		if s != "" && (s == name || s == id || (len(s) >= 12 && strings.HasPrefix(id, s))) {
			return true
		}
	}
	return false
}

// candidates are the containers that may be joining network (id, name):
// not running and asking for it, less those whose known ports differ from
// the joining sandbox's (ports nil: Join did not say; Docker lists a
// container's ports only once it was started, so this only tells apart
// restarted containers). complete is false
// when a container that may be joining does not name its networks yet:
// then a single candidate proves nothing.
func candidates(cs []knownContainer, id, name string, ports portSet) (found []knownContainer, complete bool) {
	complete = true
	for _, c := range cs {
		if c.Running {
			continue
		}
		if c.Networks == nil {
			complete = false
			continue
		}
		if !c.asksFor(id, name) {
			continue
		}
		if ports != nil && c.Ports != nil && !maps.Equal(ports, c.Ports) {
			continue
		}
		found = append(found, c)
	}
	return found, complete
}

// commonLabels are the candidates' labels on network when they are the
// same for every candidate but for the container's name, which is left
// out; ok is false when they differ (or there is no candidate).
func commonLabels(cs []knownContainer, network string) (labels map[string]string, ok bool) {
	for i, c := range cs {
		l := c.labelsOn(network)
		delete(l, policy.LabelContainer)
		if i == 0 {
			labels = l
			continue
		}
		if !maps.Equal(labels, l) {
			return nil, false
		}
	}
	return labels, len(cs) > 0
}

// joinPorts are the container ports Join's options name (the sandbox's
// port map and exposed ports); nil when they name none.
func joinPorts(opts map[string]interface{}) portSet {
	var out portSet
	for _, key := range []string{ports.OptPortMap, ports.OptExposedPorts} {
		raw, ok := opts[key]
		if !ok || raw == nil {
			continue
		}
		b, err := json.Marshal(raw)
		if err != nil {
			continue
		}
		var list []struct{ Proto, Port int }
		if json.Unmarshal(b, &list) != nil {
			continue
		}
		for _, p := range list {
			if out == nil {
				out = portSet{}
			}
			out[portKey(p.Port, protoName(p.Proto))] = true
		}
	}
	return out
}

// protoName is Docker's IP protocol number as a listing names it.
func protoName(n int) string {
	switch n {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return fmt.Sprint(n)
}

func portKey(port int, proto string) string { return fmt.Sprintf("%d/%s", port, proto) }

// fromSummary is a container as Docker's listing shows it. The listing
// shows a container's ports only once it was started: before, they are
// unknown.
func fromSummary(s container.Summary) knownContainer {
	c := knownContainer{ID: s.ID, Labels: s.Labels, Running: s.State == "running" || s.State == "paused"}
	if len(s.Names) > 0 {
		c.Name = strings.TrimPrefix(s.Names[0], "/")
	}
	c.Networks = []string{}
	if m := s.HostConfig.NetworkMode; m != "" {
		c.Networks = append(c.Networks, m)
	}
	if s.NetworkSettings != nil {
		for k, ep := range s.NetworkSettings.Networks {
			c.Networks = append(c.Networks, k)
			if ep != nil && ep.NetworkID != "" {
				c.Networks = append(c.Networks, ep.NetworkID)
			}
		}
	}
	for _, p := range s.Ports {
		if c.Ports == nil {
			c.Ports = portSet{}
		}
		c.Ports[portKey(int(p.PrivatePort), p.Type)] = true
	}
	return c
}

// containerCache is the learner's view of Docker's containers. Waiters
// are woken on every change.
type containerCache struct {
	mu      sync.Mutex
	byID    map[string]knownContainer
	changed chan struct{}
	// inFlight counts the listings of a container under way (describe);
	// gone marks those destroyed meanwhile, which a listing taken before
	// the destroy must not bring back.
	inFlight map[string]int
	gone     map[string]bool
}

func newContainerCache() *containerCache {
	return &containerCache{byID: map[string]knownContainer{}, changed: make(chan struct{}),
		inFlight: map[string]int{}, gone: map[string]bool{}}
}

// notify wakes the waiters; cc.mu is held.
func (cc *containerCache) notify() {
	close(cc.changed)
	cc.changed = make(chan struct{})
}

// set adds or replaces a container.
func (cc *containerCache) set(c knownContainer) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.byID[c.ID] = c
	cc.notify()
}

// update applies f to the container id; false when it is not known.
func (cc *containerCache) update(id string, f func(c *knownContainer)) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	c, ok := cc.byID[id]
	if !ok {
		return false
	}
	f(&c)
	cc.byID[id] = c
	cc.notify()
	return true
}

// remove forgets a destroyed container.
func (cc *containerCache) remove(id string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	delete(cc.byID, id)
	if cc.inFlight[id] > 0 {
		cc.gone[id] = true
	}
	cc.notify()
}

// describing notes a listing of id under way (before it is asked).
func (cc *containerCache) describing(id string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.inFlight[id]++
}

// described applies a listing of id noted by describing (got nil: not
// listed). The events since are newer than the listing: it only fills in
// what they do not say. A container not in the view is added only when
// mayAdd, and never when destroyed since the listing was asked.
func (cc *containerCache) described(id string, got *knownContainer, mayAdd bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	gone := cc.gone[id]
	if cc.inFlight[id]--; cc.inFlight[id] <= 0 {
		delete(cc.inFlight, id)
		delete(cc.gone, id)
	}
	c, ok := cc.byID[id]
	if got == nil || gone || !ok && !mayAdd {
		return
	}
	if !ok {
		c = *got
	}
	c.Networks = got.Networks
	if got.Ports != nil {
		c.Ports = got.Ports
	}
	cc.byID[id] = c
	cc.notify()
}

// reset replaces the view with a listing's.
func (cc *containerCache) reset(cs []knownContainer) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.byID = make(map[string]knownContainer, len(cs))
	for _, c := range cs {
		cc.byID[c.ID] = c
	}
	cc.notify()
}

func (cc *containerCache) all() []knownContainer {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	out := make([]knownContainer, 0, len(cc.byID))
	for _, c := range cc.byID {
		out = append(out, c)
	}
	return out
}

func (cc *containerCache) get(id string) (knownContainer, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	c, ok := cc.byID[id]
	return c, ok
}

// waitFor returns the first container match accepts, waiting for changes
// until ctx ends.
func (cc *containerCache) waitFor(ctx context.Context, match func(knownContainer) bool) (knownContainer, error) {
	for {
		cc.mu.Lock()
		for _, c := range cc.byID {
			if match(c) {
				cc.mu.Unlock()
				return c, nil
			}
		}
		changed := cc.changed
		cc.mu.Unlock()
		select {
		case <-ctx.Done():
			return knownContainer{}, ctx.Err()
		case <-changed:
		}
	}
}
