package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestArgv(t *testing.T) {
	env := []string{"DAEMON_ARGS=--a 1  --b", "EMPTY=", "X=x y"}
	for _, tc := range []struct {
		execStart string
		want      []string
	}{
		{"/usr/bin/etcd $DAEMON_ARGS", []string{"/usr/bin/etcd", "--a", "1", "--b"}},
		{"/usr/bin/etcd $EMPTY", []string{"/usr/bin/etcd"}},
		{"-/bin/prog ${X} --v=${X}", []string{"/bin/prog", "x y", "--v=x y"}},
		{`/bin/sh -c "echo $X"`, []string{"/bin/sh", "-c", "echo $X"}},
		{"/usr/local/bin/calico-cnm serve", []string{"/usr/local/bin/calico-cnm", "serve"}},
	} {
		if got := argv(tc.execStart, env); !slices.Equal(got, tc.want) {
			t.Errorf("argv(%q) = %q, want %q", tc.execStart, got, tc.want)
		}
	}
}

// TestEnvironment: EnvironmentFile= wins over Environment=, a missing
// optional file is skipped, a missing required one is an error, and the
// specifiers are expanded.
func TestEnvironment(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	if err := os.WriteFile(envFile, []byte("# comment\nETCD_DATA_DIR=/data\nQUOTED=\"a b\"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := &unit{name: "etcd.service", hostname: "node1", service: map[string][]string{}}
	for k, v := range map[string][]string{
		"Environment":     {"ETCD_NAME=%H", `ETCD_DATA_DIR=/var/lib/etcd/default "SPACED=x y"`},
		"EnvironmentFile": {"-" + filepath.Join(dir, "missing"), envFile},
	} {
		for _, s := range v {
			u.service[k] = append(u.service[k], u.specifiers(s))
		}
	}
	env, err := u.environment()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ETCD_NAME=node1", "ETCD_DATA_DIR=/data", "QUOTED=a b", "SPACED=x y"} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %s: %q", want, env)
		}
	}
	u.service["EnvironmentFile"] = []string{filepath.Join(dir, "missing")}
	if _, err := u.environment(); err == nil {
		t.Error("a missing EnvironmentFile without - was accepted")
	}
	if got := u.specifiers("%p %n 100%%"); got != "etcd etcd.service 100%" {
		t.Errorf("specifiers = %q", got)
	}
}
