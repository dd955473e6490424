package plugin

import (
	"context"
	"fmt"
	"os"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/dockerapi"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy"
)

// policyRunner is network policy (package policy): the nftables tables
// "calico-cnm" of the host namespace, kept in step with the datastore's
// pools, networks, endpoints, nodes and policies. newPolicy only builds
// it, so that the network driver can wait on it (Join returns once the
// endpoint's rules are in the kernel); start spawns it without delaying
// the plugin sockets, and until the datastore has been read the previous
// run's tables keep protecting the running containers. The tables stay
// when it stops (see policy's package documentation).
type policyRunner struct {
	syncer *policy.Syncer
	labels *dockerLabels
	nft    *policy.NFT
	names  *dockerNames
	node   string
	log    logrus.FieldLogger
}

// newPolicy programs the policy's tables through conn, which the caller
// closes after the runner.
func newPolicy(cfg Config, store *datastore.Store, records datastore.Records, conn *nft.Conn, log logrus.FieldLogger) (*policyRunner, error) {
	log = log.WithField("component", "policy")
	tables := policy.NFTOn(conn)
	// Network names and container labels come from Docker; a Docker API
	// that cannot be reached only delays naming (and makes labels
	// unknown), so a bad DOCKER_HOST is an error here and nothing else is.
	names, err := newDockerNames(cfg.DockerHost)
	if err != nil {
		return nil, err
	}
	failsafe := policy.DefaultFailsafe()
	if cfg.Failsafe != nil {
		failsafe = *cfg.Failsafe
	}
	failsafe = withOwnPorts(failsafe, cfg)
	syncer, err := policy.NewSyncer(policy.Config{
		Store:          store,
		Records:        records,
		Node:           cfg.NodeName,
		Dataplane:      tables,
		Names:          names,
		IPv6:           ipv6Available(cfg.ProcSys),
		ResyncInterval: cfg.ResyncInterval,
		Log:            log,
		Failsafe:       &failsafe,
	})
	if err != nil {
		names.cli.Close()
		return nil, err
	}
	return &policyRunner{syncer: syncer, labels: newDockerLabels(names.cli, store, cfg.NodeName, log), nft: tables, names: names, node: cfg.NodeName, log: log}, nil
}

// start runs the syncer and the label learner under sup; the returned
// function releases the handles once sup has stopped.
func (p *policyRunner) start(sup *supervisor) (release func()) {
	sup.Service("network policy", p.syncer.Run)
	sup.Service("container labels", func(ctx context.Context) error {
		p.labels.Run(ctx)
		return ctx.Err()
	})
	return p.close
}

func (p *policyRunner) close() {
	p.names.cli.Close()
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
	cli, err := dockerapi.NewClient(host)
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
		return "", false, fmt.Errorf("inspecting Docker network %s: %w", dataplane.ShortID(id), err)
	}
	// Docker matches ids by prefix too: make sure it is this network.
	if n.ID != id {
		return "", false, nil
	}
	return n.Name, true, nil
}
