package harness

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

type tarResult struct {
	once sync.Once
	path string
	err  error
}

var (
	tarsMu sync.Mutex
	tars   = map[string]*tarResult{}
)

// ImportBusybox imports the busybox image (harness.Image, "bb:latest") into
// this host's dockerd: /bin/busybox from busybox-static plus a symlink for
// every applet (sh, ip, ping, sleep, cat, ifconfig, route, wget, nc, ...).
// The tarball is built once per test process.
func (h *Host) ImportBusybox(t testing.TB) {
	t.Helper()
	h.ImportImage(t, Image)
}

// ImportImage imports image (name[:tag]) made of busybox plus the given host
// binaries, each at its own absolute path with the shared libraries ldd
// reports (e.g. ImportImage(t, "bb-iperf", "/usr/bin/iperf3")). The tarball
// is built once per test process for each set of binaries.
func (h *Host) ImportImage(t testing.TB, image string, binaries ...string) {
	t.Helper()
	tarPath := RootfsTar(t, binaries...)
	if !strings.Contains(image, ":") {
		image += ":latest"
	}
	if _, err := h.Docker(t, "import", tarPath, image); err != nil {
		t.Fatalf("harness: %s: importing %s: %v", h.Name, image, err)
	}
}

// RootfsTar returns the path of a rootfs tarball (busybox + binaries with
// their libraries), built once per test process per set of binaries.
func RootfsTar(t testing.TB, binaries ...string) string {
	t.Helper()
	bins := append([]string(nil), binaries...)
	sort.Strings(bins)
	key := strings.Join(bins, "\x00")
	tarsMu.Lock()
	r := tars[key]
	if r == nil {
		r = &tarResult{}
		tars[key] = r
	}
	n := len(tars)
	tarsMu.Unlock()
	r.once.Do(func() {
		dir := filepath.Join(processDir(t), fmt.Sprintf("rootfs-%d", n))
		r.path, r.err = buildRootfsTar(dir, bins)
	})
	if r.err != nil {
		t.Fatalf("harness: building rootfs tarball: %v", r.err)
	}
	return r.path
}

func buildRootfsTar(dir string, binaries []string) (string, error) {
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "proc", "sys", "dev", "root", "var/run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return "", err
	}
	if err := copyFile(BusyboxPath, filepath.Join(root, "bin", "busybox")); err != nil {
		return "", err
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/services": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	for _, b := range binaries {
		deps, err := sharedLibs(b)
		if err != nil {
			return "", err
		}
		for _, f := range append([]string{b}, deps...) {
			dst := filepath.Join(root, f)
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return "", err
			}
			if err := copyFile(f, dst); err != nil {
				return "", err
			}
		}
	}
	tarPath := filepath.Join(dir, "rootfs.tar")
	if b, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", tarPath, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar: %v: %s", err, b)
	}
	_ = os.RemoveAll(root)
	return tarPath, nil
}

var lddPath = regexp.MustCompile(`(?:=>\s*)?(/[^\s]+)\s+\(0x`)

// sharedLibs lists the absolute paths of the shared libraries (and the
// dynamic loader) a binary needs; none for a static binary.
func sharedLibs(bin string) ([]string, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, err
	}
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") || strings.Contains(string(out), "statically linked") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("ldd %s: %s", bin, strings.TrimSpace(line))
		}
		if m := lddPath.FindStringSubmatch(line); m != nil {
			libs = append(libs, m[1])
		}
	}
	return libs, nil
}

// copyFile copies src (following symlinks) to dst with src's mode.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
