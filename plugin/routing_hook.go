package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

// startRouting starts the BGP speaker and kernel route programming under
// sup when configured; the returned function stops the speaker and
// releases the routing table once sup has stopped.
//
// It only validates and spawns: node registration, address detection and
// the speaker all retry in the background, so a slow datastore or a BGP
// port still held by a dying predecessor never delays the plugin sockets.
func startRouting(sup *supervisor, cfg Config, store *datastore.Store, records datastore.Records, engine *ipam.Engine, vxlan routing.VXLANRouter, rm RoutingMetrics, health *Health, log logrus.FieldLogger) (release func(), err error) {
	if !cfg.BGP.Enabled {
		return func() {}, nil
	}
	bgp := cfg.BGP
	if bgp.StatusSocket == "" {
		bgp.StatusSocket = filepath.Join(cfg.StateDir, routing.StatusSocketName)
	}
	if err := bgp.Finish(); err != nil {
		return nil, err
	}
	routes, err := routing.NewNetlinkTable()
	if err != nil {
		return nil, fmt.Errorf("opening the kernel routing table: %w", err)
	}
	speaker := routing.NewGoBGP(log)
	agent, err := routing.NewAgent(routing.Deps{
		Store: store, Records: records, Blocks: engine, Speaker: speaker, Routes: routes,
		NodeName: cfg.NodeName, Config: bgp, Log: log, ResyncInterval: cfg.ResyncInterval, VXLAN: vxlan,
	})
	if err != nil {
		routes.Close()
		return nil, err
	}
	if health != nil {
		health.Require("BGP routes", func() error { return routeHealth(agent.Status(sup.ctx)) })
	}
	sup.Service("BGP routing", agent.Run)
	sup.Service("routing metrics", func(ctx context.Context) error {
		exportRoutingMetrics(ctx, agent, rm, metricsInterval)
		return ctx.Err()
	})
	return func() {
		// Graceful: sessions end with the process, without a NOTIFICATION,
		// so peers keep our routes through a restart (see GoBGP.Stop).
		speaker.Stop(true)
		routes.Close()
	}, nil
}

// metricsInterval is how often the BGP gauges follow the agent's status;
// Prometheus scrapes are rarely more frequent.
const metricsInterval = 5 * time.Second

// statusSource is the part of routing.Agent the gauges read.
type statusSource interface {
	Status(context.Context) routing.Status
}

// exportRoutingMetrics keeps the BGP gauges equal to the agent's last
// reconciled state until ctx is done.
func exportRoutingMetrics(ctx context.Context, src statusSource, rm RoutingMetrics, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		setRoutingMetrics(src.Status(ctx), rm)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func setRoutingMetrics(st routing.Status, rm RoutingMetrics) {
	up := 0
	for _, p := range st.Peers {
		if p.State == "Established" {
			up++
		}
	}
	if rm.SessionsUp != nil {
		rm.SessionsUp.Set(float64(up))
	}
	if rm.RoutesInstalled != nil {
		rm.RoutesInstalled.Set(float64(len(st.Routes)))
	}
}

// routeHealth is red while learned routes cannot be programmed.
func routeHealth(st routing.Status) error {
	if st.RouteError != "" {
		return fmt.Errorf("learned routes cannot be programmed: %s", st.RouteError)
	}
	return nil
}
