package driver

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/datastore"
)

// joinLimits are the bandwidth limits of the joining endpoint: its driver
// options (recorded by CreateEndpoint) over the labels just learnt over
// its network's defaults. A bad value fails the Join, naming the label or
// option.
func (d *NetworkDriver) joinLimits(ep datastore.Endpoint, labels map[string]string, plan joinPlan) (bandwidth.Limits, error) {
	l, err := bandwidth.Resolve(ep.BandwidthOptions, labels, plan.netOptions)
	if err != nil {
		return l, userError(fmt.Sprintf("endpoint %s: %v", short(ep.ID), err), ErrInvalidRequest, err)
	}
	return l, nil
}

// shapeAsync puts the limits in place before Join returns, so that the
// container's first packet is shaped; the result comes on the channel.
// Nothing to shape answers at once, without a goroutine.
func (d *NetworkDriver) shapeAsync(ctx context.Context, endpointID, hostIfName string, l bandwidth.Limits) <-chan error {
	done := make(chan error, 1)
	if d.opts.Shaper == nil || l.None() {
		done <- nil
		return done
	}
	go func() {
		if err := d.opts.Shaper.Apply(ctx, endpointID, hostIfName, l); err != nil {
			done <- fmt.Errorf("applying the bandwidth limits (%s) of endpoint %s failed: %w", l, short(endpointID), err)
			return
		}
		done <- nil
	}()
	return done
}

// unshape removes an endpoint's shaping (its ifb device outlives the
// veth); a failure is left to the resync, which removes leftovers.
func (d *NetworkDriver) unshape(ctx context.Context, endpointID, hostIfName string, log logrus.FieldLogger) {
	if d.opts.Shaper == nil {
		return
	}
	if err := d.opts.Shaper.Remove(ctx, endpointID, hostIfName); err != nil {
		log.WithError(err).Warn("removing the bandwidth shaping of the endpoint (the resync retries)")
	}
}
