package datastore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// FormatKey holds the Format record: the version of the layout of every
// other record under the prefix, and the cluster's identity.
const FormatKey = "format"

// CurrentFormat is the format this build reads and writes. Data written
// before the format was recorded (no FormatKey) is format 1.
const CurrentFormat = 1

// Format is the datastore's format record.
type Format struct {
	Version int `json:"version"`
	// ClusterID names the cluster the records belong to: a backup is only
	// restored into the cluster it was taken from.
	ClusterID string `json:"clusterID"`
	// WrittenBy is the calico-cnm version that wrote the record last.
	WrittenBy string    `json:"writtenBy,omitempty"`
	Updated   time.Time `json:"updated"`
	// Restore, while set, holds new address assignments back: a restore
	// is being written or its nodes have not reconciled yet (see
	// RestoreHold).
	Restore *RestoreHold `json:"restore,omitempty"`
}

// ErrFormatTooNew: the datastore (or a backup) was written by a newer
// calico-cnm in a format this one cannot read without misreading it.
var ErrFormatTooNew = errors.New("datastore format is newer than this calico-cnm understands")

// FormatTooNewError is ErrFormatTooNew with the versions involved.
type FormatTooNewError struct {
	What      string // "the datastore", "backup file.json"
	Found     int
	WrittenBy string
}

func (e *FormatTooNewError) Error() string {
	by := ""
	if e.WrittenBy != "" {
		by = " (written by calico-cnm " + e.WrittenBy + ")"
	}
	return fmt.Sprintf("%s has format version %d%s, but this calico-cnm only understands up to version %d: upgrade this calico-cnm to the version the other hosts run rather than let it misread the records",
		e.What, e.Found, by, CurrentFormat)
}

func (e *FormatTooNewError) Unwrap() error { return ErrFormatTooNew }

// CheckFormatVersion refuses a format newer than CurrentFormat.
func CheckFormatVersion(what string, f Format) error {
	if f.Version > CurrentFormat {
		return &FormatTooNewError{What: what, Found: f.Version, WrittenBy: f.WrittenBy}
	}
	return nil
}

// ReadFormat returns the format record and its revision; with none, the
// implied format 1 of unversioned data and revision 0.
func (s *Store) ReadFormat(ctx context.Context) (Format, int64, error) {
	f, rev, _, err := s.ReadFormatAt(ctx)
	return f, rev, err
}

// ReadFormatAt is ReadFormat with the store revision of the read too: a
// watch from it misses no later rewrite, and unlike the record's own
// revision (old, as the record seldom changes) it is not compacted away.
func (s *Store) ReadFormatAt(ctx context.Context) (f Format, rev, storeRev int64, err error) {
	kvs, storeRev, err := s.ListWithRevision(ctx, FormatKey)
	if err != nil {
		return Format{}, 0, 0, err
	}
	for _, kv := range kvs {
		if kv.Key != FormatKey {
			continue // the prefix also matches format-*
		}
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			return Format{}, 0, 0, fmt.Errorf("decoding %s: %w", FormatKey, err)
		}
		if f.Version < 1 {
			return Format{}, 0, 0, fmt.Errorf("datastore format record %s has no valid version (%d)", FormatKey, f.Version)
		}
		return f, kv.ModRevision, storeRev, nil
	}
	return Format{Version: 1}, 0, storeRev, nil
}

// CheckFormat refuses a datastore in a newer format than this build's
// (the operator commands call it before touching anything). It writes
// nothing.
func (s *Store) CheckFormat(ctx context.Context) error {
	f, _, err := s.ReadFormat(ctx)
	if err != nil {
		return err
	}
	return CheckFormatVersion("the datastore", f)
}

// FormatUpgrade rewrites the records of format From into From+1. It must
// be idempotent: a daemon may die half way and the next one runs it again.
type FormatUpgrade struct {
	From int
	Run  func(ctx context.Context, s *Store) error
}

// formatUpgrades are this build's upgrade steps, one per format after 1.
// Format 1 is the first: nothing to upgrade yet.
func formatUpgrades() []FormatUpgrade { return nil }

// EnsureFormat is what a daemon runs before serving: it refuses a newer
// format, upgrades an older one step by step, and records the current
// format. A datastore without a format record (format 1, or brand new)
// gets one, with clusterID when the host remembers the cluster it belongs
// to (its datastore was lost), else a new one.
func (s *Store) EnsureFormat(ctx context.Context, clusterID, writtenBy string) (Format, error) {
	return s.ensureFormat(ctx, CurrentFormat, formatUpgrades(), clusterID, writtenBy)
}

func (s *Store) ensureFormat(ctx context.Context, current int, steps []FormatUpgrade, clusterID, writtenBy string) (Format, error) {
	var out Format
	err := s.Retry(ctx, func(ctx context.Context) error {
		f, rev, err := s.ReadFormat(ctx)
		if err != nil {
			return err
		}
		if f.Version > current {
			return &FormatTooNewError{What: "the datastore", Found: f.Version, WrittenBy: f.WrittenBy}
		}
		if rev != 0 && f.Version == current && f.ClusterID != "" {
			out = f
			return nil
		}
		for v := f.Version; v < current; v++ {
			step, ok := findUpgrade(steps, v)
			if !ok {
				return fmt.Errorf("no upgrade from datastore format %d to %d in this build", v, v+1)
			}
			if err := step.Run(ctx, s); err != nil {
				return fmt.Errorf("upgrading the datastore from format %d to %d: %w", v, v+1, err)
			}
			s.log.WithFields(logrus.Fields{"from": v, "to": v + 1}).Info("upgraded the datastore format")
		}
		if f.ClusterID == "" {
			f.ClusterID = clusterID
		}
		if f.ClusterID == "" {
			f.ClusterID = NewClusterID()
		}
		f.Version, f.WrittenBy, f.Updated = current, writtenBy, time.Now().UTC()
		// Guarded by the revision read: two daemons starting at once on an
		// unversioned datastore agree on one cluster id.
		if err := s.Txn(ctx, Write(FormatKey, MustJSON(f), rev)); err != nil {
			return err
		}
		out = f
		return nil
	})
	return out, err
}

func findUpgrade(steps []FormatUpgrade, from int) (FormatUpgrade, bool) {
	for _, st := range steps {
		if st.From == from {
			return st, true
		}
	}
	return FormatUpgrade{}, false
}

// NewClusterID is a random cluster identity.
func NewClusterID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
