package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
)

// hostAccess is how diags reads the host: programs and files. Tests
// inject a fake host.
type hostAccess interface {
	// Command runs a program and returns what it printed (stdout and
	// stderr); a program that is not installed gives exec.ErrNotFound.
	Command(ctx context.Context, name string, args ...string) ([]byte, error)
	ReadFile(path string) ([]byte, error)
	Glob(pattern string) ([]string, error)
	Hostname() (string, error)
}

type realHost struct{}

func (realHost) Command(ctx context.Context, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%s is not installed: %w", name, exec.ErrNotFound)
	}
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

func (realHost) ReadFile(path string) ([]byte, error)  { return os.ReadFile(path) }
func (realHost) Glob(pattern string) ([]string, error) { return filepath.Glob(pattern) }
func (realHost) Hostname() (string, error)             { return os.Hostname() }

// secretName matches settings whose values are secrets: they are masked.
// Paths (..._FILE, ..._DIR) are not secrets, their files' contents are
// never read.
var (
	secretName   = regexp.MustCompile(`(?i)pass|secret|token|credential|(^|_)pw$|(^|_)key$`)
	pathName     = regexp.MustCompile(`(?i)_(file|dir|path)$`)
	urlUserinfo  = regexp.MustCompile(`(://[^:/@\s]+):[^@/\s]+@`)
	envAssign    = regexp.MustCompile(`(?m)^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	jsonEnvEntry = regexp.MustCompile(`"([A-Za-z_][A-Za-z0-9_]*)=([^"]*)"`)
)

const masked = "***"

func isSecretName(name string) bool {
	return secretName.MatchString(name) && !pathName.MatchString(name)
}

// maskValue hides a setting's value if its name says it is a secret, and
// the password of any URL in it.
func maskValue(name, value string) string {
	if value != "" && isSecretName(name) {
		return masked
	}
	return urlUserinfo.ReplaceAllString(value, "$1:"+masked+"@")
}

// maskText masks NAME=value lines (env files), "NAME=value" strings (Docker's
// plugin settings) and URL passwords anywhere in a collected file.
func maskText(b []byte) []byte {
	b = envAssign.ReplaceAllFunc(b, func(m []byte) []byte {
		s := envAssign.FindSubmatch(m)
		return []byte(string(s[1]) + string(s[2]) + "=" + maskValue(string(s[2]), string(s[3])))
	})
	b = jsonEnvEntry.ReplaceAllFunc(b, func(m []byte) []byte {
		s := jsonEnvEntry.FindSubmatch(m)
		return []byte(`"` + string(s[1]) + "=" + maskValue(string(s[1]), string(s[2])) + `"`)
	})
	return urlUserinfo.ReplaceAll(b, []byte("$1:"+masked+"@"))
}

// notInstalled: the error says the program is missing.
func notInstalled(err error) bool { return errors.Is(err, exec.ErrNotFound) }
