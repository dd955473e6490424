package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// TestArchitectureNamesEveryPackage: docs/architecture.md's package map
// names every Go package of the repository, and only directories that are
// one, so the map cannot fall behind a package added, moved or removed.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := packageMap(t, string(doc))

	var pkgs []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		if dir := filepath.ToSlash(rel) + "/"; !slices.Contains(pkgs, dir) {
			pkgs = append(pkgs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		if !slices.Contains(named, p) {
			t.Errorf("package %s is not in docs/architecture.md's package map", p)
		}
	}
	for _, n := range named {
		if !slices.Contains(pkgs, n) {
			t.Errorf("docs/architecture.md's package map names %s, which holds no Go package", n)
		}
	}
}

// packageMap is the directories listed under "## Package map": the first
// word of each indented line.
func packageMap(t *testing.T, doc string) []string {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Package map\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Package map" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var dirs []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "    ") {
			continue
		}
		dir := strings.Fields(line)[0]
		if !strings.HasSuffix(dir, "/") {
			t.Errorf("package map line does not start with a directory: %q", line)
			continue
		}
		if slices.Contains(dirs, dir) {
			t.Errorf("package map names %s twice", dir)
		}
		dirs = append(dirs, dir)
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %d directories in the package map: is the parse broken?", len(dirs))
	}
	return dirs
}
