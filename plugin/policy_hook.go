package plugin

import (
	"context"
	"fmt"
	"os"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy"
)

// startPolicy starts outgoing NAT and network isolation (package policy):
// the nftables tables "calico-cnm" of the host namespace, kept in step with
// the datastore's pools, networks, endpoints and nodes. Like startRouting it
// only validates and spawns: it never delays the plugin sockets, and the
// previous run's tables keep protecting the running containers until the
// datastore has been read. The returned stop function waits for it; the
// tables stay (see policy's package documentation).
func startPolicy(ctx context.Context, cfg Config, store *datastore.Store, engine *ipam.Engine, log logrus.FieldLogger) (stop func(), err error) {
	log = log.WithField("component", "policy")
	nft, err := policy.NewNFT("", log)
	if err != nil {
		return nil, err
	}
	// Network names come from Docker (they are not in CreateNetwork); a
	// Docker API that cannot be reached only delays naming, so a bad
	// DOCKER_HOST is an error here and nothing else is.
	names, err := newDockerNames(cfg.DockerHost)
	if err != nil {
		nft.Close()
		return nil, err
	}
	syncer, err := policy.NewSyncer(policy.Config{
		Store:          store,
		Node:           cfg.NodeName,
		Dataplane:      nft,
		Names:          names,
		IPv6:           ipv6Available(cfg.ProcSys),
		ResyncInterval: cfg.ResyncInterval,
		Log:            log,
	})
	if err != nil {
		nft.Close()
		names.cli.Close()
		return nil, err
	}
	_ = engine // pools are followed in the datastore directly (ipam.PoolsPrefix)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := syncer.Run(ctx); err != nil {
			log.WithError(err).Error("network policy stopped")
		}
	}()
	return func() {
		cancel()
		<-done
		nft.Close()
		names.cli.Close()
	}, nil
}

// ipv6Available: the ip6 table needs a kernel with IPv6 (ipv6.disable=1
// removes net/ipv6 from /proc/sys).
func ipv6Available(procSys string) bool {
	if procSys == "" {
		procSys = "/proc/sys"
	}
	_, err := os.Stat(procSys + "/net/ipv6")
	return err == nil
}

// dockerNames is policy.NameResolver over the Docker API.
type dockerNames struct {
	cli *client.Client
}

func newDockerNames(host string) (*dockerNames, error) {
	cli, err := newDockerClient(host)
	if err != nil {
		return nil, err
	}
	return &dockerNames{cli: cli}, nil
}

// NetworkName inspects the network by id.
func (d *dockerNames) NetworkName(ctx context.Context, id string) (string, bool, error) {
	n, err := d.cli.NetworkInspect(ctx, id, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("inspecting Docker network %s: %w", shortID(id), err)
	}
	// Docker matches ids by prefix too: make sure it is this network.
	if n.ID != id {
		return "", false, nil
	}
	return n.Name, true, nil
}
