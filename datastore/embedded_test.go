package datastore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// embeddedOnSockets is the configuration of an embedded member on unix
// sockets in a fresh state dir (removed when t ends), as the daemon
// configures it, and that dir. The dir is made directly under the system's
// temporary dir: a unix socket path is limited to 108 bytes, and
// t.TempDir can be longer.
func embeddedOnSockets(t *testing.T, pattern string) (Config, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return Config{
		Embedded:          true,
		DataDir:           filepath.Join(dir, "etcd"),
		EmbeddedClientURL: EmbeddedClientURL(dir),
		EmbeddedPeerURL:   EmbeddedPeerURL(dir),
	}, dir
}

// TestEmbeddedMemberOnRootOnlySockets: by default (as the daemon configures
// it) the embedded member serves clients and peers on unix sockets of mode
// 0600 in the state dir, so no local user but root reaches its client API
// or its raft port, and the store works through the client socket.
func TestEmbeddedMemberOnRootOnlySockets(t *testing.T) {
	cfg, dir := embeddedOnSockets(t, "cnm-emb")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	store, err := Open(ctx, cfg, log)
	if err != nil {
		t.Fatalf("opening an embedded member on unix sockets: %v", err)
	}
	t.Cleanup(func() { store.Close() })
	for _, name := range []string{EmbeddedClientSocket, EmbeddedPeerSocket} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a socket with mode 0600", name, st.Mode())
		}
	}
	if err := store.Txn(ctx, Create("probe", []byte("1"))); err != nil {
		t.Fatalf("write through the client socket: %v", err)
	}
	if kv, err := store.Get(ctx, "probe"); err != nil || string(kv.Value) != "1" {
		t.Fatalf("read back: %q, %v", kv.Value, err)
	}
	if _, err := store.Get(ctx, "absent"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of an absent key: %v, want ErrNotFound", err)
	}
}
