package datastore

import "context"

// EnsureFormatWith is ensureFormat for tests: a build whose current format
// and upgrade steps the test chooses.
var EnsureFormatWith = (*Store).ensureFormat

// ListForTest and WatchForTest run one step of the syncer's loop.
func (s *Syncer) ListForTest(ctx context.Context) (int64, error)    { return s.list(ctx) }
func (s *Syncer) WatchForTest(ctx context.Context, rev int64) error { return s.watch(ctx, rev) }
