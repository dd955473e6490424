package routing

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MaxPasswordLen is the TCP MD5 key limit (TCP_MD5SIG_MAXKEYLEN).
const MaxPasswordLen = 80

// ReadSecret reads the BGP password named name from dir: the file's first
// line. The name must be a plain file name (no path), the file must not be
// readable by group or others, and the password must be 1-80 bytes.
func ReadSecret(dir, name string) (string, error) {
	if dir == "" {
		dir = DefaultSecretsDir
	}
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return "", fmt.Errorf("BGP secret name %q is not a plain file name", name)
	}
	path := filepath.Join(dir, name)
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("BGP secret %s: %s does not exist on this node", name, path)
		}
		return "", fmt.Errorf("BGP secret %s: %w", name, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("BGP secret %s: %s is readable by others (mode %04o); chmod 600 it", name, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("BGP secret %s: %w", name, err)
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimRight(pw, "\r")
	if pw == "" {
		return "", fmt.Errorf("BGP secret %s: %s is empty", name, path)
	}
	if len(pw) > MaxPasswordLen {
		return "", fmt.Errorf("BGP secret %s: the password is longer than %d bytes, the TCP MD5 limit", name, MaxPasswordLen)
	}
	return pw, nil
}
