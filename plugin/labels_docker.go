package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy"
)

// dockerLabels is driver.Labeller over the Docker API: it finds the
// container that is joining and computes its policy labels.
//
// Join runs while dockerd holds the container's lock (container start and
// network connect both do), so inspecting that container would wait for
// our own answer. Listing does not: it reads dockerd's lock-free view,
// in which a container being started is "created" (or "exited" when
// restarted) and names the network it asked for. The joining container is
// the one such container on this network; when there are several (started
// at the same moment) or none (a running container being connected), the
// labels are unknown and the endpoint fails closed.
type dockerLabels struct {
	cli   *client.Client
	store *datastore.Store
}

// ErrLabelsUnknown: the joining container could not be identified.
var ErrLabelsUnknown = errors.New("cannot tell which container is joining")

// States of a container whose start is in progress, in the listing.
var startingStates = []string{"created", "exited", "restarting"}

func (d *dockerLabels) EndpointLabels(ctx context.Context, networkID, endpointID, sandboxKey string) (map[string]string, error) {
	name := d.networkName(ctx, networkID)
	args := filters.NewArgs()
	for _, s := range startingStates {
		args.Add("status", s)
	}
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, fmt.Errorf("listing Docker's containers: %w", err)
	}
	var found []container.Summary
	for _, c := range list {
		if onNetwork(c, networkID, name) {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 1:
		c := found[0]
		cname := ""
		if len(c.Names) > 0 {
			cname = c.Names[0]
		}
		return policy.EndpointLabels(c.Labels, cname, name), nil
	case 0:
		return nil, fmt.Errorf("%w: no container starting on network %s (a running container being connected?)", ErrLabelsUnknown, shortID(networkID))
	}
	return nil, fmt.Errorf("%w: %d containers are starting on network %s at once", ErrLabelsUnknown, len(found), shortID(networkID))
}

// onNetwork: the listing says c asked for this network (by name or id).
func onNetwork(c container.Summary, id, name string) bool {
	is := func(s string) bool {
		return s != "" && (s == name || s == id || (len(s) >= 12 && strings.HasPrefix(id, s)))
	}
	if is(c.HostConfig.NetworkMode) {
		return true
	}
	if c.NetworkSettings != nil {
		for k, ep := range c.NetworkSettings.Networks {
			if is(k) || (ep != nil && ep.NetworkID == id) {
				return true
			}
		}
	}
	return false
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

// relearnInterval is how often endpoints whose labels were unknown at
// Join are looked up again.
const relearnInterval = time.Second

// relearn gives this node's joined endpoints whose labels were unknown at
// Join their labels once Docker's listing shows which container holds them
// (after the start or connect completed, the listing has the endpoint id).
// Until then they stay fail-closed.
func (d *dockerLabels) relearn(ctx context.Context, node string, log logrus.FieldLogger) {
	ticker := time.NewTicker(relearnInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if err := d.relearnOnce(ctx, node, log); err != nil && ctx.Err() == nil {
			log.WithError(err).Debug("re-learning endpoint labels")
		}
	}
}

func (d *dockerLabels) relearnOnce(ctx context.Context, node string, log logrus.FieldLogger) error {
	kvs, err := d.store.List(ctx, datastore.EndpointsPrefix+node+"/")
	if err != nil {
		return err
	}
	unknown := map[string]datastore.KV{}
	for _, kv := range kvs {
		var ep datastore.Endpoint
		if json.Unmarshal(kv.Value, &ep) == nil && ep.Joined && ep.LabelsUnknown {
			unknown[ep.ID] = kv
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	list, err := d.cli.ContainerList(ctx, container.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Docker's containers: %w", err)
	}
	for _, c := range list {
		if c.NetworkSettings == nil {
			continue
		}
		for netName, es := range c.NetworkSettings.Networks {
			kv, ok := unknown[endpointIDOf(es)]
			if !ok {
				continue
			}
			cname := ""
			if len(c.Names) > 0 {
				cname = c.Names[0]
			}
			labels := policy.EndpointLabels(c.Labels, cname, netName)
			var ep datastore.Endpoint
			if err := json.Unmarshal(kv.Value, &ep); err != nil {
				continue
			}
			ep.Labels, ep.LabelsUnknown = labels, false
			// Guarded: a Leave or another Join since the read wins.
			if err := d.store.Txn(ctx, datastore.Update(kv.Key, datastore.MustJSON(ep), kv.ModRevision)); err != nil {
				log.WithError(err).WithField("endpoint", shortID(ep.ID)).Debug("recording re-learnt labels")
				continue
			}
			log.WithFields(logrus.Fields{"endpoint": shortID(ep.ID), "container": cname}).Info("learnt the labels of an endpoint joined with unknown labels")
		}
	}
	return nil
}

func endpointIDOf(es *network.EndpointSettings) string {
	if es == nil {
		return ""
	}
	return es.EndpointID
}
