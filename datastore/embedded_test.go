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

// TestEmbeddedMemberOnRootOnlySockets: by default (as the daemon configures
// it) the embedded member serves clients and peers on unix sockets of mode
// 0600 in the state dir, so no local user but root reaches its client API
// or its raft port, and the store works through the client socket.
func TestEmbeddedMemberOnRootOnlySockets(t *testing.T) {
	// A unix socket path is limited to 108 bytes; t.TempDir can be long.
	dir, err := os.MkdirTemp("", "cnm-emb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	store, err := Open(ctx, Config{
		Embedded:          true,
		DataDir:           filepath.Join(dir, "etcd"),
		EmbeddedClientURL: EmbeddedClientURL(dir),
		EmbeddedPeerURL:   EmbeddedPeerURL(dir),
	}, log)
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
