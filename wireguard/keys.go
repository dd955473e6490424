package wireguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyFile is where, under the state directory, the node's private key
// lives (mode 0600, base64 as `wg genkey` writes it). It never enters the
// datastore: the node record carries only the public key.
const KeyFile = "wireguard/private.key"

// keyMode is the key file's mode: readable by the daemon's user only.
const keyMode = 0o600

// LoadOrCreateKey reads the private key from stateDir, generating and
// saving one the first time.
func LoadOrCreateKey(stateDir string) (wgtypes.Key, error) {
	path := filepath.Join(stateDir, KeyFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
		if err != nil {
			return wgtypes.Key{}, fmt.Errorf("reading the WireGuard key %s: %w", path, err)
		}
		// A key restored or copied with a wider mode is narrowed
		// before use, not trusted as it is.
		if err := os.Chmod(path, keyMode); err != nil {
			return wgtypes.Key{}, fmt.Errorf("restricting the WireGuard key %s to mode 0600: %w", path, err)
		}
		return k, nil
	case !errors.Is(err, os.ErrNotExist):
		return wgtypes.Key{}, fmt.Errorf("reading the WireGuard key: %w", err)
	}
	return NewKey(stateDir)
}

// NewKey generates a private key and saves it in stateDir in place of the
// old one (written aside and renamed: a crash leaves one or the other).
func NewKey(stateDir string) (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generating a WireGuard key: %w", err)
	}
	path := filepath.Join(stateDir, KeyFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	tmp := path + ".new"
	// A .new left by a crash may have any mode, and WriteFile keeps the
	// mode of a file that exists: start from none.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, keyMode)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	_, werr := f.WriteString(k.String() + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(tmp)
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	return k, nil
}
