package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/routing"
)

// ClusterIDFile, in the state dir, is the cluster identity this host last
// served: when the datastore is lost (the embedded member's data removed,
// the external members wiped) the daemon writes it back into the new
// format record, so that the cluster's backups can be restored there.
const ClusterIDFile = "cluster-id"

// ensureFormat refuses a datastore in a newer format, upgrades an older
// one and records the format (see datastore.EnsureFormat), and remembers
// the cluster id in the state dir.
func ensureFormat(ctx context.Context, cfg Config, store *datastore.Store, log logrus.FieldLogger) (datastore.Format, error) {
	path := filepath.Join(cfg.StateDir, ClusterIDFile)
	remembered := ""
	if b, err := os.ReadFile(path); err == nil {
		remembered = strings.TrimSpace(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		log.WithError(err).Warn("reading the remembered cluster id")
	}
	var f datastore.Format
	// The datastore may still be electing a leader: wait as Open did.
	err := retryUnavailable(ctx, 90*time.Second, func(ctx context.Context) error {
		var err error
		f, err = store.EnsureFormat(ctx, remembered, cfg.Version)
		return err
	})
	if err != nil {
		return f, fmt.Errorf("checking the datastore format: %w", err)
	}
	if remembered != "" && remembered != f.ClusterID {
		log.WithFields(logrus.Fields{"remembered": remembered, "cluster": f.ClusterID}).Warn("this host served another cluster before: now serving the datastore's")
	}
	if remembered != f.ClusterID {
		if err := os.MkdirAll(cfg.StateDir, 0o755); err == nil {
			err = os.WriteFile(path, []byte(f.ClusterID+"\n"), 0o644)
		}
		if err != nil {
			log.WithError(err).Warn("could not remember the cluster id in the state dir")
		}
	}
	log.WithFields(logrus.Fields{"format": f.Version, "cluster": f.ClusterID}).Info("datastore format checked")
	return f, nil
}

// restoreHoldWait is how long an address request waits for a restore's
// reconcile passes before it is refused: well within Docker's timeout for
// a plugin call.
const restoreHoldWait = 15 * time.Second

// retryUnavailable runs fn until it answers something else than
// ErrUnavailable, or for at most d.
func retryUnavailable(ctx context.Context, d time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		err := fn(ctx)
		if !errors.Is(err, datastore.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// followFormat kicks the reconciler whenever the format record changes (a
// restore writes it last) and says loudly when a newer calico-cnm
// upgraded the format under this daemon. It watches the record, re-watches
// after a broken watch, and reads it again every resync (a watch on a wiped
// and restored member waits for revisions it had seen before, which the new
// member reaches late or never), until ctx is done.
func followFormat(ctx context.Context, store *datastore.Store, resync time.Duration, kick chan<- struct{}, log logrus.FieldLogger) {
	last := int64(-1) // revision of the format record last seen (0: none)
	var readAt int64  // store revision of the last read
	check := func() {
		f, rev, storeRev, err := store.ReadFormatAt(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.WithError(err).Debug("reading the datastore format record")
			}
			return
		}
		readAt = storeRev
		changed := last >= 0 && rev != last
		last = rev
		if !changed {
			return
		}
		if err := datastore.CheckFormatVersion("the datastore", f); err != nil {
			log.WithError(err).Error("a newer calico-cnm changed the datastore format under this daemon: upgrade this host")
		}
		log.WithField("cluster", f.ClusterID).Info("datastore format record rewritten (a restore?): reconciling")
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	poll := time.NewTicker(resync)
	defer poll.Stop()
	for ctx.Err() == nil {
		// Read before each watch, and watch from that read: a rewrite
		// while no watch ran (the last one broke, e.g. because the store
		// went back) is seen now, not at the next poll.
		check()
		watch := store.WatchFormat(ctx, readAt)
		for watch != nil {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-watch:
				if !ok {
					watch = nil
					continue
				}
				check()
			case <-poll.C:
				check()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// heartbeat publishes the node's heartbeat (version, routing summary)
// every datastore.HeartbeatInterval until ctx is done.
func heartbeat(ctx context.Context, cfg Config, store *datastore.Store, log logrus.FieldLogger) {
	// The status socket serves BGP's status, or VXLAN's without BGP.
	statusSocket := cfg.BGP.StatusSocket
	if statusSocket == "" {
		statusSocket = filepath.Join(cfg.StateDir, routing.StatusSocketName)
	}
	seen := datastore.NodeSeen{Node: cfg.NodeName, Version: cfg.Version, Format: datastore.CurrentFormat, Since: time.Now().UTC()}
	warned := false
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := routing.FetchStatus(sctx, statusSocket)
		cancel()
		seen.Routing = nil
		if err == nil {
			seen.Routing = summarizeRouting(st)
		}
		seen.Seen = time.Now().UTC()
		if err := store.PutSeen(ctx, seen); err != nil && ctx.Err() == nil && !warned {
			log.WithError(err).Warn("could not publish the node's heartbeat; retrying")
			warned = true
		} else if err == nil {
			warned = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(datastore.HeartbeatInterval):
		}
	}
}

// summarizeRouting counts a node status's sessions and unreached nodes.
func summarizeRouting(st routing.Status) *datastore.RoutingSummary {
	sum := &datastore.RoutingSummary{BGP: !st.BGPOff}
	if sum.BGP {
		for _, p := range st.Peers {
			sum.Peers++
			if p.State == routing.PeerEstablished {
				sum.Established++
			}
		}
	}
	if st.VXLAN != nil && st.VXLAN.Device != "" {
		sum.VXLAN = true
		for _, n := range st.VXLAN.Nodes {
			if n.Routes == routing.RouteNone || n.Routes == "" {
				sum.Unreached = append(sum.Unreached, n.Name)
			}
		}
	}
	return sum
}
