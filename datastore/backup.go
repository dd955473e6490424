package datastore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// BackupKind marks a calico-cnm datastore backup.
const BackupKind = "calico-cnm-datastore-backup"

// ErrOtherCluster: a backup taken from another cluster than the datastore
// it is restored into.
var ErrOtherCluster = errors.New("backup belongs to another cluster")

// ErrNotABackup: the file is no calico-cnm backup.
var ErrNotABackup = errors.New("not a calico-cnm datastore backup")

// Backup is an export of every record under the prefix, read at one
// revision, with the format record apart. Liveness keys are left out:
// they belong to the leases of the daemons that run when it is taken.
type Backup struct {
	Kind     string    `json:"kind"`
	Format   Format    `json:"format"`
	Prefix   string    `json:"prefix"`
	Revision int64     `json:"revision"`
	Taken    time.Time `json:"taken"`
	Records  []Record  `json:"records"`
}

// Record is one key of a backup, relative to the prefix. JSON values are
// kept as JSON (readable, diffable); anything else as base64 in Raw.
type Record struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value,omitempty"`
	Raw   []byte          `json:"raw,omitempty"`
}

// bytes is the value as it is stored: JSON compact, as the daemons write
// it (an indented backup file keeps its indentation in Value).
func (r Record) bytes() []byte {
	if r.Value == nil {
		return r.Raw
	}
	var c bytes.Buffer
	if json.Compact(&c, r.Value) != nil {
		return r.Value
	}
	return c.Bytes()
}

// notBackedUp are the keys a backup neither holds nor a restore touches:
// the format record travels in the header, and liveness keys are bound
// to the leases of running daemons.
func notBackedUp(key string) bool {
	return key == FormatKey || strings.HasPrefix(key, NodesAlivePrefix)
}

// Export reads every record under the prefix at one revision. A datastore
// in a newer format than this build's is refused: the backup would carry
// records this build cannot vouch for.
func (s *Store) Export(ctx context.Context) (Backup, error) {
	f, _, err := s.ReadFormat(ctx)
	if err != nil {
		return Backup{}, err
	}
	if err := CheckFormatVersion("the datastore", f); err != nil {
		return Backup{}, err
	}
	// One range read: etcd serves it at a single revision, so the
	// export is a consistent picture even while daemons write.
	kvs, rev, err := s.ListWithRevision(ctx, "")
	if err != nil {
		return Backup{}, fmt.Errorf("reading the datastore: %w", err)
	}
	b := Backup{Kind: BackupKind, Format: f, Prefix: s.prefix, Revision: rev, Taken: time.Now().UTC()}
	for _, kv := range kvs {
		if notBackedUp(kv.Key) {
			continue
		}
		r := Record{Key: kv.Key}
		if json.Valid(kv.Value) {
			r.Value = json.RawMessage(kv.Value)
		} else {
			r.Raw = kv.Value
		}
		b.Records = append(b.Records, r)
	}
	return b, nil
}

// ReadBackup decodes and checks a backup: its kind and that its format is
// one this build reads.
func ReadBackup(r io.Reader, name string) (Backup, error) {
	var b Backup
	if err := json.NewDecoder(r).Decode(&b); err != nil {
		return Backup{}, fmt.Errorf("%w: %s: %v", ErrNotABackup, name, err)
	}
	if b.Kind != BackupKind {
		return Backup{}, fmt.Errorf("%w: %s has kind %q", ErrNotABackup, name, b.Kind)
	}
	if b.Format.Version < 1 {
		return Backup{}, fmt.Errorf("%w: %s has no format version", ErrNotABackup, name)
	}
	if err := CheckFormatVersion("backup "+name, b.Format); err != nil {
		return Backup{}, err
	}
	return b, nil
}

// RestoreReport counts what Restore changed.
type RestoreReport struct {
	Written   int // records created or overwritten
	Deleted   int // records absent from the backup, removed
	Unchanged int // records already as in the backup
	Format    Format
}

// restoreBatch bounds the operations of one transaction: etcd refuses
// more than --max-txn-ops, 128 by default (the embedded member's too).
const restoreBatch = 128

// Restore makes the records under the prefix those of b: it writes the
// records that differ, deletes those b does not have, then writes the
// format record (and upgrades an older format). Unchanged records are not
// touched, so running daemons see events only for what really changed.
// Liveness keys stay as they are: running daemons hold them. It refuses a
// backup in a newer format, a datastore in a newer format, and a backup
// of another cluster (a datastore with no format record takes the
// backup's identity).
func (s *Store) Restore(ctx context.Context, b Backup, writtenBy string) (RestoreReport, error) {
	var rep RestoreReport
	if err := CheckFormatVersion("the backup", b.Format); err != nil {
		return rep, err
	}
	cur, curRev, err := s.ReadFormat(ctx)
	if err != nil {
		return rep, err
	}
	if err := CheckFormatVersion("the datastore", cur); err != nil {
		return rep, err
	}
	if curRev != 0 && cur.ClusterID != "" && b.Format.ClusterID != "" && cur.ClusterID != b.Format.ClusterID {
		return rep, fmt.Errorf("%w: the backup was taken from cluster %s, the datastore at %s is cluster %s",
			ErrOtherCluster, b.Format.ClusterID, s.prefix, cur.ClusterID)
	}
	existing, err := s.List(ctx, "")
	if err != nil {
		return rep, fmt.Errorf("reading the datastore: %w", err)
	}
	have := make(map[string][]byte, len(existing))
	for _, kv := range existing {
		have[kv.Key] = kv.Value
	}
	var ops []clientv3.Op
	want := make(map[string]bool, len(b.Records))
	for _, r := range b.Records {
		if notBackedUp(r.Key) || r.Key == "" {
			continue
		}
		want[r.Key] = true
		v := r.bytes()
		if old, ok := have[r.Key]; ok && bytes.Equal(old, v) {
			rep.Unchanged++
			continue
		}
		ops = append(ops, clientv3.OpPut(s.abs(r.Key), string(v)))
		rep.Written++
	}
	for _, kv := range existing {
		if notBackedUp(kv.Key) || want[kv.Key] {
			continue
		}
		ops = append(ops, clientv3.OpDelete(s.abs(kv.Key)))
		rep.Deleted++
	}
	// The format record goes last, holding assignments back until each
	// node has reconciled (RestoreHold): daemons follow it (see
	// the syncer) and reconcile once the records are all back.
	f := b.Format
	if f.ClusterID == "" {
		f.ClusterID = cur.ClusterID
	}
	f.WrittenBy, f.Updated = writtenBy, time.Now().UTC()
	hold := RestoreHold{Since: f.Updated, Pending: restoreNodes(b, existing)}
	if len(ops) < restoreBatch {
		// It fits one transaction: the restore is all or nothing.
		f.Restore = &RestoreHold{Since: hold.Since, Complete: true, Pending: hold.Pending}
		if err := s.rawTxn(ctx, append(ops, clientv3.OpPut(s.abs(FormatKey), string(MustJSON(f))))); err != nil {
			return rep, fmt.Errorf("restoring %d records in one transaction (nothing changed): %w", len(ops), err)
		}
	} else {
		// Too many for one transaction: the hold goes first, so that no
		// address is handed out from half-restored records; a restore that
		// fails half way keeps it (until RestoreHoldMax) and may be run
		// again.
		start := cur
		if curRev == 0 {
			start = f
		}
		start.Restore = &hold
		if err := s.Txn(ctx, Write(FormatKey, MustJSON(start), curRev)); err != nil {
			return rep, fmt.Errorf("marking the restore in the format record (nothing changed): %w", err)
		}
		for done := 0; len(ops) > 0; {
			n := min(len(ops), restoreBatch)
			if err := s.rawTxn(ctx, ops[:n]); err != nil {
				return rep, fmt.Errorf("restoring records (%d of %d done; new assignments are held back until the restore is run again or for %s): %w",
					done, rep.Written+rep.Deleted, RestoreHoldMax, err)
			}
			done += n
			ops = ops[n:]
		}
		f.Restore = &RestoreHold{Since: hold.Since, Complete: true, Pending: hold.Pending}
		if err := s.rawTxn(ctx, []clientv3.Op{clientv3.OpPut(s.abs(FormatKey), string(MustJSON(f)))}); err != nil {
			return rep, fmt.Errorf("writing the format record: %w", err)
		}
	}
	if rep.Format, err = s.EnsureFormat(ctx, f.ClusterID, writtenBy); err != nil {
		return rep, err
	}
	return rep, nil
}

// rawTxn applies unguarded operations at once: a restore overrides
// whatever is there.
func (s *Store) rawTxn(ctx context.Context, ops []clientv3.Op) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.txns.Add(1)
	_, err := s.client.Txn(ctx).Then(ops...).Commit()
	return s.wrap(err)
}
