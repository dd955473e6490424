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

// subscribeFormat is the subscription followFormat reads: its first
// batch is the format record as the syncer holds it when subscribing.
func subscribeFormat(ctx context.Context, records *datastore.Syncer) *datastore.Subscription {
	return records.Subscribe(ctx, "datastore format", datastore.FormatKey)
}

// followFormat kicks the reconciler whenever the datastore format record
// is rewritten after the first time it was seen (a restore ends by
// rewriting it), until ctx is done. It follows the record through the
// syncer, which re-lists after a broken watch, so a rewrite while no watch
// ran is seen too.
func followFormat(ctx context.Context, sub *datastore.Subscription, kick chan<- struct{}, log logrus.FieldLogger) {
	// The first batch is what the record held when the daemon started
	// (the reconciler runs at start anyway).
	for initial := true; ; initial = false {
		b, err := sub.Next(ctx)
		if err != nil {
			return
		}
		for _, c := range b.Changes {
			f, ok := recordValue[datastore.Format](c.New)
			if initial || c.Key != datastore.FormatKey || !ok {
				continue // the prefix also matches format-*
			}
			if err := datastore.CheckFormatVersion("the datastore", *f); err != nil {
				log.WithError(err).Error("a newer calico-cnm changed the datastore format under this daemon: upgrade this host")
			}
			log.WithField("cluster", f.ClusterID).Info("datastore format record rewritten (a restore?): reconciling")
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
}

// recordValue is r's decoded value when it is a *T.
func recordValue[T any](r *datastore.Synced) (*T, bool) {
	if r == nil {
		return nil, false
	}
	v, ok := r.Value.(*T)
	return v, ok
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
