package plugin

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// blackholeRouter is a blockRouter whose listing can fail, and can end the
// daemon's context while it does, as a stop in the middle of a pass would.
type blackholeRouter struct {
	listErr error
	cancel  context.CancelFunc
}

func (r *blackholeRouter) EnsureBlackhole(context.Context, net.IPNet) error { return nil }
func (r *blackholeRouter) RemoveBlackhole(context.Context, net.IPNet) error { return nil }
func (r *blackholeRouter) ListBlackholes(context.Context) ([]net.IPNet, error) {
	if r.cancel != nil {
		r.cancel()
	}
	return nil, r.listErr
}

// warnings collects the entries logged at warning or above, in order.
type warnings chan *logrus.Entry

func (w warnings) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}
func (w warnings) Fire(e *logrus.Entry) error { w <- e; return nil }

// blackholeService is the blackhole service's logger, which hands what it
// logs at warning or above to seen, and its config for node.
func blackholeService(node string) (*logrus.Logger, warnings, Config) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	seen := make(warnings, 16)
	log.AddHook(seen)
	cfg := DefaultConfig(func(string) string { return "" })
	cfg.NodeName = node
	return log, seen, cfg
}

// A daemon's clean stop must log no warning (TestStartAndCleanStopLogNoWarning
// end to end): a blackhole pass that the stop cuts short, before or during
// its datastore calls, ends quietly, while a pass that fails on a live
// daemon still says so.
func TestBlackholePassCutShortByStopLogsNoWarning(t *testing.T) {
	m := etcdtest.Start(t)
	engine := ipam.New(m.Store, ipam.Options{Log: quietLogger()})
	if _, err := engine.AddPool(context.Background(), ipam.Pool{CIDR: "10.31.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	// An error after the context ended need not wrap context.Canceled
	// (the datastore's is a grpc status): the pass must ask the context.
	notContextCanceled := errors.New("rpc error: code = Canceled desc = context canceled")

	for _, tc := range []struct {
		name       string
		stopBefore bool // the daemon stops before the first pass starts
		stopInList bool // the daemon stops while the pass lists the kernel's routes
	}{
		{name: "stopped before the pass", stopBefore: true},
		{name: "stopped during the pass", stopInList: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dp := &blackholeRouter{listErr: notContextCanceled}
			if tc.stopInList {
				dp.cancel = cancel
			}
			if tc.stopBefore {
				cancel()
			}
			log, seen, cfg := blackholeService("stopping-host")

			err := syncBlackholes(ctx, engine, dp, cfg, log)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("syncBlackholes returned %v, want context.Canceled", err)
			}
			close(seen)
			for e := range seen {
				t.Errorf("warning logged by a pass the stop cut short: %s %v", e.Message, e.Data)
			}
		})
	}

	t.Run("failing on a live daemon", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		dp := &blackholeRouter{listErr: errors.New("netlink: route dump interrupted")}
		log, seen, cfg := blackholeService("live-host")
		done := make(chan error, 1)
		go func() { done <- syncBlackholes(ctx, engine, dp, cfg, log) }()
		defer func() {
			cancel()
			<-done
		}()
		select {
		case e := <-seen:
			if e.Message != "reconciling blackhole routes" {
				t.Fatalf("first warning %q, want the failed blackhole pass", e.Message)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a blackhole pass that failed on a live daemon logged no warning")
		}
	})
}
