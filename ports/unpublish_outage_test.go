package ports

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/internal/netnstest"
	"github.com/calico-cnm/calico-cnm/nft"
)

// TestUnpublishNeedsNoDatastoreRoundTrip: docker rm -f first revokes the
// container's external connectivity. For an endpoint without published
// ports that is answered from the syncer's memory, so it succeeds at once
// while etcd is gone instead of waiting out the request timeout; an
// endpoint whose ports must be forgotten in the datastore still fails with
// the datastore unreachable.
func TestUnpublishNeedsNoDatastoreRoundTrip(t *testing.T) {
	ns := netnstest.NewNamed(t, "portstest", "withdrawing published ports while etcd is down")
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	conn, err := nft.New("/var/run/netns/"+ns, log)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	m := etcdtest.Start(t)
	const timeout = 2 * time.Second
	cfg := m.Config
	cfg.Embedded, cfg.Endpoints, cfg.RequestTimeout, cfg.DialTimeout = false, []string{cfg.EmbeddedClientURL}, timeout, time.Second
	ctx := context.Background()
	store, err := datastore.Open(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	bind := []datastore.PortBinding{{Proto: "tcp", HostPort: 18080, Port: 8080}}
	for id, ports := range map[string][]datastore.PortBinding{"plain": nil, "published": bind} {
		ep := datastore.Endpoint{ID: id, Node: "n1", IPv4: "10.0.0.1/32", HostIfName: "cali" + id, Joined: true, Ports: ports}
		if err := store.Txn(ctx, datastore.Create(datastore.EndpointKey("n1", id), datastore.MustJSON(ep))); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon's syncer itself: etcdtest.Records would ask etcd on
	// every read.
	records, err := datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: datastore.Kinds(), ResyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = records.Run(sctx) }()
	t.Cleanup(func() { stop(); <-stopped })
	mgr := NewManager(store, records, "n1", NewTables(conn), nil, false, nil, log)
	if err := mgr.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	if err := m.Store.Close(); err != nil { // the member goes away
		t.Fatal(err)
	}
	began := time.Now()
	if err := mgr.Unpublish(ctx, "plain"); err != nil {
		t.Errorf("withdrawing an endpoint without published ports while etcd is down: %v", err)
	}
	if took := time.Since(began); took >= timeout {
		t.Errorf("withdrawing an endpoint without published ports took %s with etcd down: it waited for the datastore (request timeout %s)", took, timeout)
	}
	err = mgr.Unpublish(ctx, "published")
	if !errors.Is(err, datastore.ErrUnavailable) {
		t.Errorf("forgetting published ports while etcd is down: %v, want the datastore unreachable", err)
	}
}
