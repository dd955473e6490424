package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/internal/dockerapi"
	"github.com/calico-cnm/calico-cnm/internal/retry"
)

// DockerSource is the reconcile loop's view of Docker.
type DockerSource interface {
	// View lists every endpoint Docker has, on every network. An error
	// means the view is unknown.
	View(ctx context.Context) (DockerView, error)
	// Changes signals (coalesced) that Docker attached or detached
	// something, or that the event stream was re-established (events may
	// have been missed). It is closed when ctx is done.
	Changes(ctx context.Context) <-chan struct{}
}

// Docker call bounds: a hung dockerd must not hang the reconcile loop.
const dockerCallTimeout = 15 * time.Second

// dockerClient is DockerSource over the Docker Engine API.
type dockerClient struct {
	cli    *client.Client
	log    logrus.FieldLogger
	engine *dockerapi.EngineIdentity
}

// NewDockerSource is the Docker view reconcile compares with (see
// newDockerClient for host).
func NewDockerSource(host string, log logrus.FieldLogger) (DockerSource, error) {
	cli, err := dockerapi.NewClient(host)
	if err != nil {
		return nil, err
	}
	return &dockerClient{cli: cli, log: log, engine: dockerapi.IdentityOf(cli)}, nil
}

// View inspects every network but host and null (which have no addresses).
// A network removed between the list and its inspect has no endpoints.
func (d *dockerClient) View(ctx context.Context) (DockerView, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	nets, err := d.cli.NetworkList(ctx, network.ListOptions{})
	if err != nil {
		return DockerView{}, fmt.Errorf("listing Docker networks at %s: %w", d.cli.DaemonHost(), err)
	}
	view := DockerView{Endpoints: map[string]DockerEndpoint{}, AuxAddresses: map[netip.Addr]string{}}
	// Without it reconcile cannot tell other hosts' records from ours and
	// treats all records of this node name as its own (as before engine
	// IDs were recorded).
	if view.EngineID, err = d.engine.Lookup(ctx); err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			// The daemon is stopping: no view, and nothing to warn about.
			return DockerView{}, ctx.Err()
		}
		d.log.WithError(err).Warn("Docker engine ID unknown")
	}
	for _, n := range nets {
		if n.Driver == "host" || n.Driver == "null" {
			continue
		}
		insp, err := d.cli.NetworkInspect(ctx, n.ID, network.InspectOptions{})
		if cerrdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return DockerView{}, fmt.Errorf("inspecting Docker network %s: %w", n.Name, err)
		}
		for _, cfg := range insp.IPAM.Config {
			for _, aux := range cfg.AuxAddress {
				if ip, err := netip.ParseAddr(aux); err == nil {
					view.AuxAddresses[ip.Unmap()] = n.Name
				}
			}
		}
		for _, c := range insp.Containers {
			if c.EndpointID == "" {
				continue
			}
			de := DockerEndpoint{ID: c.EndpointID, Network: n.ID, MAC: c.MacAddress}
			for _, s := range []string{c.IPv4Address, c.IPv6Address} {
				if p, err := netip.ParsePrefix(s); err == nil {
					de.IPs = append(de.IPs, p.Addr().Unmap())
				}
			}
			view.Endpoints[c.EndpointID] = de
		}
	}
	return view, nil
}

// Changes follows Docker's events: network connect/disconnect/destroy and
// container die/destroy. When the stream breaks (dockerd restarting) it
// reconnects with backoff and signals once reconnected.
func (d *dockerClient) Changes(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default: // one pending signal is enough
		}
	}
	f := filters.NewArgs(
		filters.Arg("type", string(events.NetworkEventType)),
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("event", string(events.ActionConnect)),
		filters.Arg("event", string(events.ActionDisconnect)),
		filters.Arg("event", string(events.ActionDie)),
		filters.Arg("event", string(events.ActionDestroy)),
	)
	go func() {
		defer close(out)
		backoff := retry.New(retry.Standard())
		for first := true; ; first = false {
			sctx, cancel := context.WithCancel(ctx)
			msgs, errs := d.cli.Events(sctx, events.ListOptions{Filters: f})
			if !first && d.ping(ctx) == nil {
				signal() // events may have been missed while disconnected
			}
			err := func() error {
				for {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case m := <-msgs:
						backoff.Reset() // the stream works
						d.log.WithFields(logrus.Fields{"type": m.Type, "action": m.Action, "id": dataplane.ShortID(m.Actor.ID)}).Debug("Docker event")
						signal()
					case err := <-errs:
						return err
					}
				}
			}()
			cancel()
			if ctx.Err() != nil {
				return
			}
			d.log.WithError(err).Debug("Docker event stream ended, reconnecting")
			if !backoff.Wait(ctx) {
				return
			}
		}
	}()
	return out
}

func (d *dockerClient) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dockerapi.CallTimeout)
	defer cancel()
	_, err := d.cli.Ping(ctx)
	return err
}
