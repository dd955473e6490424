package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
)

func intPtr(n int) *int { return &n }

// TestParseDockerArgs: which command lines the API path answers, and
// how; every other one goes to the CLI (nil).
func TestParseDockerArgs(t *testing.T) {
	cases := []struct {
		args string // split on " "
		want dockerCmd
	}{
		// run -d
		{"run -d --name c1 --net net1 bb sleep 3600", &dockerRun{name: "c1", network: "net1", image: "bb", cmd: []string{"sleep", "3600"}}},
		{"run -d --restart=always --name n1 --net calico-net --ip 192.168.0.77 bb sleep 3600",
			&dockerRun{name: "n1", network: "calico-net", ip: "192.168.0.77", restart: "always", image: "bb", cmd: []string{"sleep", "3600"}}},
		{"run -d --name att --stop-timeout 1 --network sw bb sleep 3600",
			&dockerRun{name: "att", network: "sw", stopTimeout: intPtr(1), image: "bb", cmd: []string{"sleep", "3600"}}},
		{"run -d --name x1 --net=n --label a=b -l c=d --label=e --restart unless-stopped bb",
			&dockerRun{name: "x1", network: "n", labels: []string{"a=b", "c=d", "e"}, restart: "unless-stopped", image: "bb"}},
		{"run --detach --net n6 --ip6 fd00::5 bbiperf:latest iperf3 -s", &dockerRun{network: "n6", ip6: "fd00::5", image: "bbiperf:latest", cmd: []string{"iperf3", "-s"}}},
		// after the image everything is the command
		{"run -d bb sh -c x --name y", &dockerRun{image: "bb", cmd: []string{"sh", "-c", "x", "--name", "y"}}},
		{"run --rm --net n bb true", nil},                        // not detached
		{"run -d -p 8080:80 --name web bb sleep 1", nil},         // -p: not done
		{"run -d --cap-add NET_ADMIN --name i3 bb sleep 1", nil}, // the newer client rewrites it to CAP_NET_ADMIN
		{"run -d --rm bb true", nil},                             // unknown flag
		{"run -dt bb true", nil},                                 // combined short flags
		{"run -d=true bb true", nil},                             // a form not done
		{"run -d --restart on-failure:3 bb true", nil},           // restart count
		{"run -d --restart sometimes bb true", nil},              // the CLI's error
		{"run -d --net a --net b bb true", nil},                  // two networks
		{"run -d --name a bb true", nil},                         // a name dockerd rejects
		{"run -d --name c1 --name c2 bb true", nil},              // the last would win
		{"run -d --ip 10.0.0.1 bb true", nil},                    // --ip without --net
		{"run -d --net n --ip fd00::1 bb true", nil},             // IPv6 given to --ip
		{"run -d --net n --ip6 10.0.0.1 bb true", nil},           // IPv4 given to --ip6
		{"run -d --net n --ip 10.0.0.300 bb true", nil},          // not an address
		{"run -d --stop-timeout 010 bb true", nil},               // pflag reads it as octal
		{"run -d --label  a=b bb true", nil},                     // empty word: a label "" (white space)
		{"run -d --net=container:c1 bb true", nil},               // container network mode
		{"run -d --net a=b bb true", nil},                        // the long --network syntax
		{"run -d localhost:5000/bb true", nil},                   // registry host
		{"run -d BB true", nil},                                  // the CLI's reference error
		{"run -d -- bb true", nil},                               // end of flags
		{"run -d --name", nil},                                   // no value
		{"run -d", nil},                                          // no image
		{"run -d --stop-signal KILL bb true", nil},               // any other flag
		{"run -d -e A=b bb true", nil},                           // any other flag
		// exec
		{"exec c1 ping -c 1 10.0.0.1", &dockerExec{container: "c1", cmd: []string{"ping", "-c", "1", "10.0.0.1"}}},
		{"exec -d c1 sh -c x", &dockerExec{detach: true, container: "c1", cmd: []string{"sh", "-c", "x"}}},
		{"exec c1 sh -d", &dockerExec{container: "c1", cmd: []string{"sh", "-d"}}},
		{"exec -it c1 sh", nil},
		{"exec -i c1 sh", nil},
		{"exec -e A=b c1 env", nil},
		{"exec -u root c1 id", nil},
		{"exec --detach=true c1 true", nil},
		{"exec c1", nil}, // no command
		{"exec /c1 true", nil},
		// rm -f
		{"rm -f c1", &dockerRm{names: []string{"c1"}}},
		{"rm -f -v a b", &dockerRm{volumes: true, names: []string{"a", "b"}}},
		{"rm a --force --volumes", &dockerRm{volumes: true, names: []string{"a"}}},
		{"rm c1", nil},     // without -f a missing container is an error: left to the CLI
		{"rm -f", nil},     // no name
		{"rm -fv a", nil},  // combined short flags
		{"rm -f a a", nil}, // a name twice
		{"rm -f /a", nil},  // the CLI trims "/"
		{"rm -f --link a", nil},
		// inspect -f
		{"inspect -f {{.Id}} c1", &dockerInspect{format: "{{.Id}}", names: []string{"c1"}}},
		{"inspect --format {{.Name}} c1 c2", &dockerInspect{format: "{{.Name}}", names: []string{"c1", "c2"}}},
		{"inspect --format={{.Name}} c1", &dockerInspect{format: "{{.Name}}", names: []string{"c1"}}},
		{"inspect c1 -f {{.Id}}", &dockerInspect{format: "{{.Id}}", names: []string{"c1"}}},
		{"inspect c1", nil},           // indented JSON
		{"inspect -f  c1", nil},       // empty template: indented JSON too
		{"inspect -f {{.Id}}", nil},   // no name
		{"inspect -f{{.Id}} c1", nil}, // attached short flag value
		{"inspect -f=x c1", nil},      // a form not done
		{"inspect -f a -f b c1", nil}, // the last would win
		{"inspect --type container -f {{.Id}} c1", nil},
		{"inspect -s -f {{.Id}} c1", nil},
		// ps -q
		{"ps -aq", &dockerPs{all: true}},
		{"ps -qa", &dockerPs{all: true}},
		{"ps -q --no-trunc --filter label=a=b --filter status=running", &dockerPs{noTrunc: true, filters: [][2]string{{"label", "a=b"}, {"status", "running"}}}},
		{"ps -a -q -f status=exited --filter=network=n", &dockerPs{all: true, filters: [][2]string{{"status", "exited"}, {"network", "n"}}}},
		{"ps", nil},                            // a table
		{"ps -a", nil},                         // a table
		{"ps -a --format {{.Names}}", nil},     // a template
		{"ps --no-trunc -q svc", nil},          // no arguments taken
		{"ps -q --filter Status=running", nil}, // the CLI lower-cases the key
		{"ps -q --filter status", nil},         // the CLI's error
		{"ps -q -n 3", nil},
		{"ps -q --quiet=true", nil},
		// anything else
		{"network inspect -f {{.Id}} n1", nil},
		{"image inspect -f {{.Id}} bb", nil},
		{"start c1", nil},
		{"", nil},
	}
	for _, c := range cases {
		args := strings.Split(c.args, " ")
		if c.args == "" {
			args = nil
		}
		got := parseDockerArgs(args)
		if c.want == nil {
			if got != nil {
				t.Errorf("%q: handled as %+v, want the CLI", c.args, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.args, got, c.want)
		}
	}
}

// TestRunRequestIsTheCLIs: the create request of run -d is the one the
// 20.10 CLI sent for the same command line (testdata, captured from
// /usr/bin/docker): the same values, and nothing else but zero values.
func TestRunRequestIsTheCLIs(t *testing.T) {
	golden, err := os.ReadFile("testdata/cli-run-create.json")
	if err != nil {
		t.Fatal(err)
	}
	cmd := parseDockerArgs(strings.Fields("run -d --name golden1 --net n1 --ip 10.0.0.5 --ip6 fd00::5 --label x=y -l z=w -l k --stop-timeout 3 --restart=always bb sleep 1000"))
	r, ok := cmd.(*dockerRun)
	if !ok {
		t.Fatalf("not handled: %v", cmd)
	}
	cfg, hc, nc := r.configs()
	ours, err := json.Marshal(container.CreateRequest{Config: cfg, HostConfig: hc, NetworkingConfig: nc})
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	if err := json.Unmarshal(golden, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(ours, &got); err != nil {
		t.Fatal(err)
	}
	for _, d := range jsonDiff("", want, got) {
		t.Error(d)
	}
}

// jsonDiff lists where a and b differ, a key missing on one side being
// equal to a zero value (null, "", 0, false) on the other.
func jsonDiff(path string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var diffs []string
		for k, av := range am {
			diffs = append(diffs, jsonDiff(path+"."+k, av, bm[k])...)
		}
		for k, bv := range bm {
			if _, ok := am[k]; !ok {
				diffs = append(diffs, jsonDiff(path+"."+k, nil, bv)...)
			}
		}
		return diffs
	}
	zero := func(v any) bool { return v == nil || v == "" || v == float64(0) || v == false }
	if reflect.DeepEqual(a, b) || zero(a) && zero(b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: CLI %v, API %v", path, a, b)}
}

func TestRunErrorLikeTheCLI(t *testing.T) {
	err := errors.New(`Error response from daemon: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "nosuchcmd": executable file not found in $PATH: unknown`)
	if got := runStatus(err); got != 127 {
		t.Errorf("status %d, want 127", got)
	}
	if got, want := runError(err, false), "docker: "+err.Error()+".\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	err = errors.New(`Error response from daemon: Conflict. The container name "/aa" is already in use by container "aec4". You have to remove (or rename) that container to be able to reuse that name.`)
	if got := runStatus(err); got != 125 {
		t.Errorf("status %d, want 125", got)
	}
	if got, want := runError(err, true), "docker: "+err.Error()+"\nSee 'docker run --help'.\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestDockerAPIMatchesCLI runs command lines through the CLI and through
// the API path on a scratch dockerd and compares stdout and error text.
// Names are given with "@", which becomes "zcli" or "zapi".
func TestDockerAPIMatchesCLI(t *testing.T) {
	RequirePrereqs(t)
	if apiPathOff() {
		t.Skipf("%s (or DOCKER_CERT_PATH, DOCKER_TLS_VERIFY, DOCKER_CONTENT_TRUST) is set: the API path is off", dockerCLIEnv)
	}
	h := NewHost(t, "apicli", HostOptions{})
	h.ImportBusybox(t)

	do := func(who string, timeout time.Duration, args ...string) (string, string) {
		t.Helper()
		named := strings.Contains(strings.Join(args, " "), "@")
		args = append([]string(nil), args...)
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "@", who)
		}
		argv := append([]string{DockerPath, "-H", h.DockerHost()}, args...)
		var out string
		var err error
		if who == "zcli" {
			out, err = runCmdTimeout(nil, timeout, dockerEnv(), argv...)
		} else {
			out, err = h.dockerAPI(context.Background(), timeout, argv, args)
			if errors.Is(err, errUseCLI) {
				t.Fatalf("%q: not handled in-process", args)
			}
		}
		errText := ""
		if err != nil {
			errText = strings.TrimPrefix(err.Error(), shellQuote(argv))
		}
		norm := func(s string) string {
			if named {
				s = strings.ReplaceAll(s, who, "@")
			}
			return strings.TrimSpace(s)
		}
		return norm(out), norm(errText)
	}
	idRE := regexp.MustCompile(`\b[0-9a-f]{64}\b`)
	sameWithin := func(timeout time.Duration, args ...string) (string, string) {
		t.Helper()
		cliOut, cliErr := do("zcli", timeout, args...)
		apiOut, apiErr := do("zapi", timeout, args...)
		// Container IDs differ: compare their places.
		if idRE.ReplaceAllString(cliOut, "ID") != idRE.ReplaceAllString(apiOut, "ID") || idRE.ReplaceAllString(cliErr, "ID") != idRE.ReplaceAllString(apiErr, "ID") {
			t.Errorf("%q:\nCLI %q, error %q\nAPI %q, error %q", args, cliOut, cliErr, apiOut, apiErr)
		} else {
			t.Logf("%q: %q, error %q", args, apiOut, apiErr)
		}
		return apiOut, apiErr
	}
	same := func(args ...string) (string, string) {
		t.Helper()
		return sameWithin(CommandTimeout, args...)
	}

	// run -d: the same output, and the same container.
	if out, _ := same("run", "-d", "--name", "@1", "--net", "none", "--label", "a=b", "-l", "c", "--stop-timeout", "2", "--restart", "unless-stopped", Image, "sleep", "600"); !idRE.MatchString(out) {
		t.Fatalf("run -d printed %q", out)
	}
	same("run", "-d", "--name", "@2", "--net", "none", Image, "sh", "-c", "echo hello; echo oops >&2; sleep 600")
	compareContainers(t, h, "zcli1", "zapi1")
	same("run", "-d", "--name", "@1", "--net", "none", Image, "true")          // name in use: create fails
	same("run", "-d", "--name", "@3", "--net", "nosuchnet", Image, "true")     // start fails, container left
	same("run", "-d", "--name", "@4", "--net", "none", Image, "nosuchcommand") // exit status 127

	// inspect -f
	for _, tmpl := range []string{
		"{{.Id}}",
		"{{.Name}}",
		"{{.State.Running}} {{.State.Pid}}",
		`{{(index .NetworkSettings.Networks "none").IPAddress}}`,
		"{{.NetworkSettings.IPAddress}}",
		"{{json .Config.Labels}}",
		"{{.Config.Cmd}}",
		"{{.HostConfig.RestartPolicy.Name}} {{.Config.StopTimeout}}",
		"{{range $k, $v := .Config.Labels}}{{$k}}={{$v}} {{end}}",
		`{{upper .Name}} {{pad .Name 1 2}}|{{truncate .Id 5}} {{lower "AB"}} {{title "ab"}} {{join (split "a,b" ",") "+"}} {{json .Name}}`,
	} {
		same("inspect", "-f", tmpl, "zapi1") // the same container: the same text
	}
	same("inspect", "-f", "{{.Name}}", "@1", "@2")
	// Templates whose typed and raw texts differ, or that fail, are left to
	// the CLI (join on the raw JSON's []any fails).
	for _, tmpl := range []string{"{{json .NetworkSettings}}", "{{.State}}", `{{(index .NetworkSettings.Networks "nonet").IPAddress}}`, "{{.Nonesuch}}", `{{join .Config.Cmd ","}}`} {
		args := []string{"inspect", "-f", tmpl, "zapi1"}
		if _, err := h.dockerAPI(context.Background(), CommandTimeout, append([]string{DockerPath, "-H", h.DockerHost()}, args...), args); !errors.Is(err, errUseCLI) {
			t.Errorf("%q: handled in-process (%v), want the CLI", args, err)
		}
	}

	// exec
	same("exec", "@1", "sh", "-c", "echo out; echo err >&2")
	same("exec", "@1", "sh", "-c", "echo out; echo err >&2; exit 3")
	same("exec", "@1", "nosuchcommand")
	same("exec", "nosuch", "true")
	same("exec", "@4", "true") // not running
	same("exec", "-d", "@1", "sleep", "1")
	// A deadline: the CLI is killed, the API path gives up; both say so.
	sameWithin(2*time.Second, "exec", "@1", "sleep", "30")

	// rm -f
	same("run", "-d", "--name", "@rm", "--net", "none", Image, "sleep", "600")
	same("rm", "-f", "@rm", "nosuch")
	same("rm", "-f", "-v", "nosuch", "@3", "@4")

	// ps -q
	same("ps", "-aq")
	same("ps", "-q", "--no-trunc", "--filter", "label=a=b")
	same("ps", "-q", "--filter", "status=running", "--filter", "network=none")
	same("ps", "-aq", "--filter", "bogus=1")
}

// compareContainers: the two containers have the same configuration.
func compareContainers(t *testing.T, h *Host, a, b string) {
	t.Helper()
	c, err := h.apiClient()
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) map[string]any {
		_, raw, err := c.ContainerInspectWithRaw(context.Background(), name, false)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		cfg := m["Config"].(map[string]any)
		delete(cfg, "Hostname") // the container's ID
		return map[string]any{"Path": m["Path"], "Args": m["Args"], "Image": m["Image"], "Config": cfg, "HostConfig": m["HostConfig"],
			"Networks": m["NetworkSettings"].(map[string]any)["Networks"].(map[string]any)["none"] != nil}
	}
	for _, d := range jsonDiff("", get(a), get(b)) {
		t.Errorf("%s vs %s: %s", a, b, d)
	}
}
