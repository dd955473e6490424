package datastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	return holdError(f.Restore, time.Now())
}

// holdError is ErrRestoreInProgress, explained, while h holds assignments
// back at now; else nil.
func holdError(h *RestoreHold, now time.Time) error {
	if h.Holding(now) {
		return fmt.Errorf("%w (%s, at most until %s): retry shortly", ErrRestoreInProgress,
			h, h.Since.Add(RestoreHoldMax).Format(time.RFC3339))
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

// RestoreGate holds address assignments back while a restore holds them,
// without a datastore read per assignment. Once it has read the format
// record holding nothing back, it remembers the record's bytes and answers
// a check of them (CheckValue) that rides in each assignment's
// transaction: an assignment commits only if no restore has rewritten the
// record since, even in a store wiped and restored, and a hold is seen by
// the very transaction it would have had to stop. A record that holds
// assignments back is read again on every Admit.
type RestoreGate struct {
	store *Store
	wait  time.Duration

	mu    sync.Mutex
	guard *Op    // the check while the record last read held nothing back
	gen   uint64 // bumped by Forget: a read begun before it is not kept
}

// RestoreGate is a gate whose Admit waits up to wait for a hold to end.
func (s *Store) RestoreGate(wait time.Duration) *RestoreGate {
	return &RestoreGate{store: s, wait: wait}
}

// Admit answers the ops to put in an assignment's transaction, or, once a
// restore has held assignments back for the gate's wait (the nodes'
// reconcile passes follow a restore within moments when their watches
// work), CheckRestoreHold's error.
func (g *RestoreGate) Admit(ctx context.Context) ([]Op, error) {
	g.mu.Lock()
	guard, gen := g.guard, g.gen
	g.mu.Unlock()
	if guard != nil {
		return []Op{*guard}, nil
	}
	deadline := time.Now().Add(g.wait)
	for {
		op, err := g.read(ctx)
		if err == nil {
			g.mu.Lock()
			if g.gen == gen {
				g.guard = &op
			}
			g.mu.Unlock()
			return []Op{op}, nil
		}
		if !errors.Is(err, ErrRestoreInProgress) || !time.Now().Before(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Forget: a transaction with Admit's ops failed a compare, perhaps theirs
// (a restore rewrote the record); the next Admit reads the record again.
func (g *RestoreGate) Forget() {
	g.mu.Lock()
	g.guard = nil
	g.gen++
	g.mu.Unlock()
}

// read is the check that the format record is still as read now, or the
// hold's error.
func (g *RestoreGate) read(ctx context.Context) (Op, error) {
	kv, err := g.store.Get(ctx, FormatKey)
	if errors.Is(err, ErrNotFound) {
		return Check(FormatKey, 0), nil // a restore creates it, holding
	}
	if err != nil {
		return Op{}, err
	}
	var f Format
	if err := json.Unmarshal(kv.Value, &f); err != nil {
		return Op{}, fmt.Errorf("decoding %s: %w", FormatKey, err)
	}
	// A hold that has run out stays out for these bytes: the check
	// still stands for them.
	if err := holdError(f.Restore, time.Now()); err != nil {
		return Op{}, err
	}
	return CheckValue(FormatKey, kv.Value), nil
}
