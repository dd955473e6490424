package datastore

// EnsureFormatWith is ensureFormat for tests: a build whose current format
// and upgrade steps the test chooses.
var EnsureFormatWith = (*Store).ensureFormat
