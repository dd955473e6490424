package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outsideRef matches what points out of the repository: a relative link
// climbing above it, the design notes kept beside it, or the directory
// the repository was written in.
var outsideRef = regexp.MustCompile(`\]\(\.\./|shared/DESIGN|(^|[\s(\x60"])/work/`)

// TestNothingPointsOutsideTheRepository: the README, the docs and the Go
// sources stand alone: no link leaves the repository and no comment names
// a path on a developer's machine.
func TestNothingPointsOutsideTheRepository(t *testing.T) {
	root := moduleRoot(t)
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "testdata" || name == "vendor" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") && !strings.HasSuffix(path, ".go") {
			return nil
		}
		if strings.HasSuffix(path, "docs_links_test.go") {
			return nil // the pattern itself
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for n, line := range strings.Split(string(b), "\n") {
			if outsideRef.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d points outside the repository: %s", rel, n+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: is the walk broken?", checked)
	}
}
