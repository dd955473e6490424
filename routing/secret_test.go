package routing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // not subject to the umask
			t.Fatal(err)
		}
	}
	write("tor1", "s3cret\nignored second line\n", 0o600)
	write("crlf", "s3cret\r\n", 0o400)
	write("open", "s3cret\n", 0o644)
	write("empty", "\n", 0o600)
	write("long", strings.Repeat("x", 81), 0o600)
	write("max", strings.Repeat("x", 80), 0o600)
	tests := []struct {
		name, secret string
		want         string
		err          string
	}{
		{"first line", "tor1", "s3cret", ""},
		{"CRLF", "crlf", "s3cret", ""},
		{"80 bytes", "max", strings.Repeat("x", 80), ""},
		{"missing", "nosuch", "", "does not exist on this node"},
		{"readable by others", "open", "", "is readable by others (mode 0644); chmod 600 it"},
		{"empty", "empty", "", "is empty"},
		{"too long", "long", "", "longer than 80 bytes"},
		{"path", "../tor1", "", "is not a plain file name"},
		{"dot dot", "..", "", "is not a plain file name"},
		{"no name", "", "", "is not a plain file name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadSecret(dir, tt.secret)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ReadSecret(%q) = %q, %v; want error containing %q", tt.secret, got, err, tt.err)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("the error shows the secret: %v", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ReadSecret(%q) = %q, %v; want %q", tt.secret, got, err, tt.want)
			}
		})
	}
}
