// Command systemctl stands in for systemd's systemctl on the e2e tests'
// network-namespace hosts, which run no systemd (docs/cluster.md, "How
// this page is tested"). It reads the real unit files and does what systemd
// does with the lines calico-cnm's and Debian's etcd units use:
//
//	systemctl daemon-reload                       nothing to do
//	systemctl [--no-block] enable [--now] UNIT... --now starts
//	systemctl [--no-block] start|restart UNIT...  Type=notify waits for READY=1 unless --no-block
//	systemctl stop UNIT...                        KillSignal=, then SIGKILL after TimeoutStopSec=
//	systemctl is-active UNIT                      "active" (exit 0) or "inactive" (exit 3)
//
// Units are looked up in /etc/systemd/system, then /lib/systemd/system.
// Honoured: EnvironmentFile= (a leading "-" makes the file optional),
// Environment=, the specifiers %H %p %n %%, $VAR and ${VAR} in
// ExecStart=, User=, Type=notify, StateDirectory= and StateDirectoryMode=,
// KillSignal=, TimeoutStartSec=, TimeoutStopSec=. Not done: Restart=
// (nothing watches the service), ordering, resource limits. A service's
// stdout and stderr go to /var/log/UNIT.log (the journal's stand-in), its
// pid to /run/systemctl-standin/UNIT.pid.
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const runDir = "/run/systemctl-standin"

var unitDirs = []string{"/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "systemctl (test stand-in):", err)
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		os.Exit(1)
	}
}

type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

func run(args []string) error {
	noBlock, now := false, false
	var words []string
	for _, a := range args {
		switch a {
		case "--no-block":
			noBlock = true
		case "--now":
			now = true
		case "--quiet", "-q", "--no-pager":
		default:
			if strings.HasPrefix(a, "-") {
				return fmt.Errorf("option %s not supported", a)
			}
			words = append(words, a)
		}
	}
	if len(words) == 0 {
		return errors.New("no verb")
	}
	verb, names := words[0], words[1:]
	if verb == "daemon-reload" {
		return nil
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: no unit", verb)
	}
	for _, name := range names {
		u, err := loadUnit(name)
		if err != nil {
			return err
		}
		switch verb {
		case "enable":
			if now {
				err = u.start(!noBlock)
			}
		case "disable":
			if now {
				err = u.stop()
			}
		case "start":
			err = u.start(!noBlock)
		case "stop":
			err = u.stop()
		case "restart":
			if err = u.stop(); err == nil {
				err = u.start(!noBlock)
			}
		case "is-active":
			if u.pid() == 0 {
				fmt.Println("inactive")
				return exitCode(3)
			}
			fmt.Println("active")
		default:
			return fmt.Errorf("verb %s not supported", verb)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", verb, u.name, err)
		}
	}
	return nil
}

// unit is the [Service] section of a unit file, as far as it is used.
type unit struct {
	name      string // calico-cnm.service
	path      string
	service   map[string][]string // key -> values in file order
	hostname  string
	stateMode os.FileMode
}

func loadUnit(name string) (*unit, error) {
	if !strings.Contains(name, ".") {
		name += ".service"
	}
	for _, dir := range unitDirs {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		u := &unit{name: name, path: p, service: map[string][]string{}, stateMode: 0o755}
		if u.hostname, err = os.Hostname(); err != nil {
			return nil, err
		}
		section := ""
		text := strings.ReplaceAll(string(b), "\\\n", " ")
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			switch {
			case line == "" || line[0] == '#' || line[0] == ';':
			case line[0] == '[':
				section = strings.Trim(line, "[]")
			case section == "Service":
				k, v, ok := strings.Cut(line, "=")
				if !ok {
					return nil, fmt.Errorf("%s: bad line %q", p, line)
				}
				k, v = strings.TrimSpace(k), u.specifiers(strings.TrimSpace(v))
				u.service[k] = append(u.service[k], v)
			}
		}
		if m := u.last("StateDirectoryMode"); m != "" {
			mode, err := strconv.ParseUint(m, 8, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: StateDirectoryMode=%s: %w", p, m, err)
			}
			u.stateMode = os.FileMode(mode)
		}
		return u, nil
	}
	return nil, fmt.Errorf("unit %s not found in %s", name, strings.Join(unitDirs, ", "))
}

func (u *unit) last(key string) string {
	if v := u.service[key]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

func (u *unit) specifiers(v string) string {
	prefix := strings.TrimSuffix(u.name, filepath.Ext(u.name))
	prefix, _, _ = strings.Cut(prefix, "@")
	return strings.NewReplacer("%%", "%", "%H", u.hostname, "%p", prefix, "%n", u.name).Replace(v)
}

// environment is what systemd gives the service: a base PATH, then
// Environment=, then EnvironmentFile= (which wins), in file order.
func (u *unit) environment() ([]string, error) {
	env := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
	for _, line := range u.service["Environment"] {
		for _, kv := range splitWords(line) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
	}
	for _, f := range u.service["EnvironmentFile"] {
		optional := strings.HasPrefix(f, "-")
		f = strings.TrimPrefix(f, "-")
		b, err := os.ReadFile(f)
		if err != nil {
			if optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' || line[0] == ';' {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
				v = v[1 : len(v)-1]
			}
			env[strings.TrimSpace(k)] = v
		}
	}
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out, nil
}

// splitWords splits at unquoted spaces and removes the quotes.
func splitWords(s string) []string {
	var words []string
	var cur strings.Builder
	quote, inWord := byte(0), false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(c)
		case c == '"' || c == '\'':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

var braceVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// argv expands ExecStart= as systemd does: a word that is exactly $VAR
// becomes the value's whitespace-separated words (none when empty), ${VAR}
// is replaced inside a word.
func argv(execStart string, env []string) []string {
	vals := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	execStart = strings.TrimLeft(execStart, "-@:+!")
	var out []string
	for _, w := range splitWords(execStart) {
		if strings.HasPrefix(w, "$") && !strings.HasPrefix(w, "${") {
			out = append(out, strings.Fields(vals[w[1:]])...)
			continue
		}
		out = append(out, braceVar.ReplaceAllStringFunc(w, func(m string) string { return vals[m[2:len(m)-1]] }))
	}
	return out
}

func (u *unit) pidFile() string { return filepath.Join(runDir, u.name+".pid") }

// pid is the service's running process, or 0.
func (u *unit) pid() int {
	b, err := os.ReadFile(u.pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !alive(pid) {
		return 0
	}
	return pid
}

// alive: the process exists and is not a zombie (nobody may reap it: the
// stand-in that started it has exited).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

func (u *unit) duration(key string, def time.Duration) (time.Duration, error) {
	v := u.last(key)
	if v == "" {
		return def, nil
	}
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

func (u *unit) start(wait bool) error {
	if u.pid() != 0 {
		return nil
	}
	env, err := u.environment()
	if err != nil {
		return err
	}
	args := argv(u.last("ExecStart"), env)
	if len(args) == 0 {
		return fmt.Errorf("%s has no ExecStart", u.path)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	uid, gid := -1, -1
	if name := u.last("User"); name != "" {
		usr, err := user.Lookup(name)
		if err != nil {
			return err
		}
		uid, _ = strconv.Atoi(usr.Uid)
		gid, _ = strconv.Atoi(usr.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		env = append(env, "USER="+name, "LOGNAME="+name, "HOME="+usr.HomeDir)
	}
	for _, d := range u.service["StateDirectory"] {
		for _, name := range strings.Fields(d) {
			p := filepath.Join("/var/lib", name)
			if err := os.MkdirAll(p, u.stateMode); err != nil {
				return err
			}
			if err := os.Chmod(p, u.stateMode); err != nil {
				return err
			}
			if uid >= 0 {
				if err := os.Chown(p, uid, gid); err != nil {
					return err
				}
			}
		}
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	var notify *net.UnixConn
	if wait && u.last("Type") == "notify" {
		sock := filepath.Join(runDir, u.name+".notify")
		_ = os.Remove(sock)
		if notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"}); err != nil {
			return err
		}
		defer notify.Close()
		if uid >= 0 {
			_ = os.Chown(sock, uid, gid)
		}
		env = append(env, "NOTIFY_SOCKET="+sock)
	}
	cmd.Env = env
	logf, err := os.OpenFile(filepath.Join("/var/log", u.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := os.WriteFile(u.pidFile(), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return err
	}
	if notify == nil {
		return cmd.Process.Release()
	}
	timeout, err := u.duration("TimeoutStartSec", 90*time.Second)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				return
			}
			for _, l := range strings.Split(string(buf[:n]), "\n") {
				if l == "READY=1" {
					close(ready)
					return
				}
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case err := <-exited:
		return fmt.Errorf("exited before READY=1: %v (log: /var/log/%s.log)", err, u.name)
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		return fmt.Errorf("no READY=1 within %s (log: /var/log/%s.log)", timeout, u.name)
	}
}

func (u *unit) stop() error {
	pid := u.pid()
	if pid == 0 {
		return nil
	}
	sig := syscall.SIGTERM
	switch u.last("KillSignal") {
	case "", "SIGTERM":
	case "SIGINT":
		sig = syscall.SIGINT
	case "SIGKILL":
		sig = syscall.SIGKILL
	default:
		return fmt.Errorf("KillSignal=%s not supported", u.last("KillSignal"))
	}
	timeout, err := u.duration("TimeoutStopSec", 90*time.Second)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(time.Hour)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return os.Remove(u.pidFile())
}
