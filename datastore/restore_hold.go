package datastore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// RestoreHoldMax bounds a restore hold: a node of the backup that never
// reconciles (dead, decommissioned) holds assignments back no longer.
const RestoreHoldMax = 2 * time.Minute

// ErrRestoreInProgress: a restore is being written or reconciled, and an
// address handed out now could be one a running container uses that the
// restored records do not hold yet.
var ErrRestoreInProgress = errors.New("a datastore restore is in progress")

// RestoreHold is the part of the format record a restore writes before
// its first record and keeps until every node it names has reconciled
// (re-assigned the addresses its live containers use): between a restore
// and those passes the records may show a live address free.
type RestoreHold struct {
	Since time.Time `json:"since"`
	// Complete: every record is written; a pass that read the records
	// before it may have seen a half-restored datastore.
	Complete bool `json:"complete"`
	// Pending are the nodes still to reconcile.
	Pending []string `json:"pending"`
}

// Holding tells whether the hold still holds assignments back at now.
func (h *RestoreHold) Holding(now time.Time) bool {
	return h != nil && (!h.Complete || len(h.Pending) > 0) && now.Before(h.Since.Add(RestoreHoldMax))
}

// Waits tells whether node has to reconcile to release the hold.
func (h *RestoreHold) Waits(node string, now time.Time) bool {
	return h.Holding(now) && h.Complete && slices.Contains(h.Pending, node)
}

func (h *RestoreHold) String() string {
	if !h.Complete {
		return "records being written"
	}
	return "waiting for " + strings.Join(h.Pending, ", ") + " to reconcile"
}

// CheckRestoreHold answers ErrRestoreInProgress while a restore holds
// assignments back.
func (s *Store) CheckRestoreHold(ctx context.Context) error {
	f, _, err := s.ReadFormat(ctx)
	if err != nil {
		return err
	}
	if f.Restore.Holding(time.Now()) {
		return fmt.Errorf("%w (%s, at most until %s): retry shortly", ErrRestoreInProgress,
			f.Restore, f.Restore.Since.Add(RestoreHoldMax).Format(time.RFC3339))
	}
	return nil
}

// ReleaseRestoreHold takes node off the hold's pending nodes, if the
// format record is still at rev (the revision read before the pass that
// reconciled: a record rewritten since may be a newer restore). The last
// node drops the hold.
func (s *Store) ReleaseRestoreHold(ctx context.Context, node string, f Format, rev int64) error {
	if f.Restore == nil || !slices.Contains(f.Restore.Pending, node) {
		return nil
	}
	h := *f.Restore
	h.Pending = slices.DeleteFunc(slices.Clone(h.Pending), func(n string) bool { return n == node })
	f.Restore = &h
	if len(h.Pending) == 0 {
		f.Restore = nil
	}
	err := s.Txn(ctx, Write(FormatKey, MustJSON(f), rev))
	if errors.Is(err, ErrConflict) {
		return nil // rewritten meanwhile: the next pass reads it again
	}
	return err
}

// restoreNodes are the nodes that reconcile after a restore: those with a
// node or endpoint record in the backup or in the datastore it replaces.
func restoreNodes(b Backup, existing []KV) []string {
	var nodes []string
	add := func(key string) {
		n, ok := strings.CutPrefix(key, NodesPrefix)
		if !ok {
			n, _, ok = strings.Cut(strings.TrimPrefix(key, EndpointsPrefix), "/")
			ok = ok && strings.HasPrefix(key, EndpointsPrefix)
		}
		if ok && n != "" && !strings.Contains(n, "/") && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	for _, r := range b.Records {
		add(r.Key)
	}
	for _, kv := range existing {
		add(kv.Key)
	}
	slices.Sort(nodes)
	return nodes
}

// AwaitRestoreHold waits up to d for a restore hold to end (the nodes'
// reconcile passes follow the restore within moments when their watches
// work), then answers CheckRestoreHold's error.
func (s *Store) AwaitRestoreHold(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := s.CheckRestoreHold(ctx)
		if !errors.Is(err, ErrRestoreInProgress) || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}
