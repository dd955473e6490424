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
	if err := os.WriteFile(tmp, []byte(k.String()+"\n"), 0o600); err != nil {
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return wgtypes.Key{}, fmt.Errorf("saving the WireGuard key: %w", err)
	}
	return k, nil
}
