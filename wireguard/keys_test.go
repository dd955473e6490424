package wireguard

import (
	"os"
	"path/filepath"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestKeyFileMode: whatever mode a key file or a crash's leftover had,
// the key in use is only ever in a 0600 file, and a saved key is loaded
// back unchanged.
func TestKeyFileMode(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string) // before LoadOrCreateKey
	}{
		{name: "first start", setup: func(t *testing.T, dir string) {}},
		{name: "a world-readable key file", setup: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, KeyFile), mustPrivateKey(t).String()+"\n", 0o644)
		}},
		{name: "a world-readable leftover of an interrupted save", setup: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, KeyFile)+".new", "junk\n", 0o666)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			k, err := LoadOrCreateKey(dir)
			if err != nil {
				t.Fatal(err)
			}
			checkKeyFile(t, dir, k)
			again, err := LoadOrCreateKey(dir)
			if err != nil || again != k {
				t.Fatalf("loaded again: %v, %v; want the same key", again.PublicKey(), err)
			}
			// A rotation over the leftover of an interrupted save.
			writeFile(t, filepath.Join(dir, KeyFile)+".new", "junk\n", 0o666)
			rotated, err := NewKey(dir)
			if err != nil || rotated == k {
				t.Fatalf("NewKey: %v, %v; want a new key", rotated.PublicKey(), err)
			}
			checkKeyFile(t, dir, rotated)
		})
	}
}

func mustPrivateKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func checkKeyFile(t *testing.T, dir string, want wgtypes.Key) {
	t.Helper()
	path := filepath.Join(dir, KeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want.String()+"\n" {
		t.Errorf("%s does not hold the key in use", path)
	}
}
