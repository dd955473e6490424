package harness

// The docker CLI costs about 0.12 s of CPU per run on a loaded machine and
// a full run of the suite starts some 1600 of them. The command lines the
// tests use most (run -d, exec, rm -f, inspect -f of containers, ps -q) are
// answered here in-process through the Engine API instead, with what the
// 20.10 CLI (/usr/bin/docker) would have printed and its exit status; every
// other command, flag or form of a flag goes to the CLI as before. The
// CLI's behaviour copied here was read in docker/cli v20.10.24 (the Debian
// package's version) and checked against it on a scratch dockerd
// (TestDockerAPIMatchesCLI).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/blkiodev"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"

	"github.com/calico-cnm/calico-cnm/internal/dockerapi"
)

// dockerCLIEnv, when set (e.g. CNME2E_DOCKER_CLI=1), sends every Docker
// command of the harness to the CLI: to check whether a difference comes
// from the in-process path.
const dockerCLIEnv = "CNME2E_DOCKER_CLI"

// errUseCLI: the command is not one the API path answers (or it could not
// tell what the CLI would say before changing anything): run the CLI.
var errUseCLI = errors.New("not handled in-process: run the docker CLI")

// exitStatus is the status the CLI would have exited with; its text is
// exec.ExitError's, which the tests see in the errors of the CLI path.
type exitStatus int

func (e exitStatus) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// dockerCmd is one parsed command line the API path answers. do returns
// what the CLI would write on stdout and stderr and, when it would fail,
// an exitStatus (or the context's error, or errUseCLI before any change).
type dockerCmd interface {
	do(ctx context.Context, c *client.Client) (stdout, stderr string, err error)
}

// apiPathOff: the CLI for everything when asked to, or when the
// environment holds something the CLI would act on (the harness strips
// DOCKER_CERT_PATH and DOCKER_TLS_VERIFY for the CLI, the client would
// use them; DOCKER_CONTENT_TRUST makes the CLI verify images).
func apiPathOff() bool {
	for _, k := range []string{dockerCLIEnv, "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "DOCKER_CONTENT_TRUST"} {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}

// dockerAPI answers args through the Engine API, as the CLI run as argv
// would; errUseCLI when it does not.
func (h *Host) dockerAPI(ctx context.Context, timeout time.Duration, argv, args []string) (string, error) {
	if apiPathOff() {
		return "", errUseCLI
	}
	cmd := parseDockerArgs(args)
	if cmd == nil {
		return "", errUseCLI
	}
	c, err := h.apiClient()
	if err != nil {
		return "", errUseCLI
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stdout, stderr, err := cmd.do(ctx, c)
	if err == nil || errors.Is(err, errUseCLI) {
		return stdout, err
	}
	if ctx.Err() != nil {
		// The CLI would have been killed; say it as runCmdTimeout does.
		err = ctx.Err()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %s", timeout)
		}
	}
	return stdout, fmt.Errorf("%s: %w: %s", shellQuote(argv), err, strings.TrimSpace(stderr))
}

// apiClient is the host's Engine API client, made at the first use and
// kept: it negotiates the API version once and reuses its connections.
func (h *Host) apiClient() (*client.Client, error) {
	h.apiMu.Lock()
	defer h.apiMu.Unlock()
	if h.api == nil {
		c, err := dockerapi.NewClient(h.DockerHost())
		if err != nil {
			return nil, fmt.Errorf("harness: %s: %w", h.Name, err)
		}
		h.api = c
	}
	return h.api, nil
}

// closeAPIClient closes the client's idle connections (at cleanup; a
// later call would open new ones).
func (h *Host) closeAPIClient() {
	h.apiMu.Lock()
	defer h.apiMu.Unlock()
	if h.api != nil {
		_ = h.api.Close()
	}
}

// fromDaemon: err is the daemon's answer to a request, whose text
// ("Error response from daemon: ...") the 20.10 client gives the same way;
// not a failure to reach the daemon or to read its answer.
func fromDaemon(err error) bool {
	return strings.HasPrefix(err.Error(), "Error response from daemon: ")
}

// noSuchContainer is what the 20.10 client says for a 404 on a container
// (its objectNotFoundError); the newer client passes the daemon's text on.
func noSuchContainer(name string) string { return "Error: No such container: " + name }

// ---------------------------------------------------------------- parsing

var (
	// A container name as dockerd accepts it, or an ID: nothing the
	// client would escape or trim, nor a flag.
	containerNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	// A network name without "=" (the CLI's long --network syntax) or
	// ":" (container:X).
	networkNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	// An image "name[:tag]" of lowercase path components, no registry
	// host or digest: the CLI passes such a name on as it is.
	imageRE = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$`)
)

// parseDockerArgs returns the command for args (after `docker -H X`), or
// nil when the CLI must run it: any flag or form not known here.
func parseDockerArgs(args []string) dockerCmd {
	if len(args) == 0 {
		return nil
	}
	var cmd dockerCmd
	var ok bool
	switch args[0] {
	case "run":
		cmd, ok = parseRun(args[1:])
	case "exec":
		cmd, ok = parseExec(args[1:])
	case "rm":
		cmd, ok = parseRm(args[1:])
	case "inspect":
		cmd, ok = parseInspect(args[1:])
	case "ps":
		cmd, ok = parsePs(args[1:])
	}
	if !ok {
		return nil
	}
	return cmd
}

// longFlag splits "--name=value"; value is set only with "=".
func longFlag(a string) (name string, value *string) {
	if !strings.HasPrefix(a, "--") {
		return a, nil
	}
	if n, v, ok := strings.Cut(a, "="); ok {
		return n, &v
	}
	return a, nil
}

// flagValue returns the value of the flag at args[*i] ("--x v", "--x=v",
// "-x v") and advances *i past it.
func flagValue(args []string, i *int, inline *string) (string, bool) {
	if inline != nil {
		return *inline, true
	}
	if *i+1 >= len(args) {
		return "", false
	}
	*i++
	return args[*i], true
}

// dockerRun is `run -d` with the flags the tests use.
type dockerRun struct {
	name, network, ip, ip6 string
	labels                 []string
	restart                string
	stopTimeout            *int
	image                  string
	cmd                    []string
}

// parseRun parses the arguments of `docker run`: flags up to the image
// (the CLI does not look for flags after it), then the command.
func parseRun(args []string) (*dockerRun, bool) {
	r := &dockerRun{}
	detach := false
	seen := map[string]bool{}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		name, inline := longFlag(args[i])
		if name == "-d" || name == "--detach" {
			if inline != nil {
				return nil, false
			}
			detach = true
			continue
		}
		// A repeated --net would add a network; of the other flags the
		// last would win: neither is done here.
		if name != "--label" && name != "-l" {
			key := name
			if key == "--network" {
				key = "--net"
			}
			if seen[key] {
				return nil, false
			}
			seen[key] = true
		}
		v, ok := flagValue(args, &i, inline)
		if !ok {
			return nil, false
		}
		switch name {
		case "--name":
			if !containerNameRE.MatchString(v) || len(v) < 2 {
				return nil, false
			}
			r.name = v
		case "--net", "--network":
			if !networkNameRE.MatchString(v) {
				return nil, false
			}
			r.network = v
		case "--ip":
			if ip := net.ParseIP(v); ip == nil || ip.To4() == nil || strings.Contains(v, ":") {
				return nil, false
			}
			r.ip = v
		case "--ip6":
			if ip := net.ParseIP(v); ip == nil || !strings.Contains(v, ":") {
				return nil, false
			}
			r.ip6 = v
		case "--label", "-l":
			// The CLI's ValidateLabel, without the white space it trims.
			key, _, _ := strings.Cut(v, "=")
			if key == "" || strings.ContainsAny(key, " \t\n\r\v\f") {
				return nil, false
			}
			r.labels = append(r.labels, v)
		case "--restart":
			switch v {
			case "no", "always", "unless-stopped", "on-failure":
			default: // on-failure:N and anything the CLI would reject
				return nil, false
			}
			r.restart = v
		case "--stop-timeout":
			n, err := strconv.Atoi(v)
			if err != nil || strconv.Itoa(n) != v { // pflag also takes 0x10, 010, +1
				return nil, false
			}
			r.stopTimeout = &n
		default:
			return nil, false
		}
	}
	if !detach || i >= len(args) || !imageRE.MatchString(args[i]) {
		return nil, false
	}
	// --ip without --net would go to the endpoint of "default"; not done.
	if (r.ip != "" || r.ip6 != "") && r.network == "" {
		return nil, false
	}
	r.image = args[i]
	if i+1 < len(args) {
		r.cmd = args[i+1:]
	}
	return r, true
}

// dockerExec is `exec [-d] CONTAINER CMD...`.
type dockerExec struct {
	detach    bool
	container string
	cmd       []string
}

func parseExec(args []string) (*dockerExec, bool) {
	e := &dockerExec{}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		if args[i] != "-d" && args[i] != "--detach" {
			return nil, false
		}
		e.detach = true
	}
	if i+1 >= len(args) || !containerNameRE.MatchString(args[i]) {
		return nil, false
	}
	e.container, e.cmd = args[i], args[i+1:]
	return e, true
}

// dockerRm is `rm -f [-v] NAME...`.
type dockerRm struct {
	volumes bool
	names   []string
}

func parseRm(args []string) (*dockerRm, bool) {
	r := &dockerRm{}
	force := false
	seen := map[string]bool{}
	for _, a := range args {
		switch {
		case a == "-f" || a == "--force":
			force = true
		case a == "-v" || a == "--volumes":
			r.volumes = true
		case containerNameRE.MatchString(a) && !seen[a]:
			// The CLI collects the answers in a map by name: a name
			// given twice is left to it.
			seen[a] = true
			r.names = append(r.names, a)
		default:
			return nil, false
		}
	}
	// Without -f the CLI fails on the first missing container: left to it.
	if !force || len(r.names) == 0 {
		return nil, false
	}
	return r, true
}

// dockerInspect is `inspect -f TEMPLATE NAME...` (containers only: anything
// else goes to the CLI, which looks for images, networks, ... too).
type dockerInspect struct {
	format string
	names  []string
}

func parseInspect(args []string) (*dockerInspect, bool) {
	in := &dockerInspect{}
	hasFormat := false
	for i := 0; i < len(args); i++ {
		name, inline := longFlag(args[i])
		switch {
		case name == "-f" || name == "--format": // inline only for "--format="
			v, ok := flagValue(args, &i, inline)
			if !ok || hasFormat {
				return nil, false
			}
			in.format, hasFormat = v, true
		case containerNameRE.MatchString(args[i]):
			in.names = append(in.names, args[i])
		default:
			return nil, false
		}
	}
	// Without a template the CLI prints indented JSON; and the CLI treats
	// an empty template as none.
	if in.format == "" || len(in.names) == 0 {
		return nil, false
	}
	return in, true
}

// dockerPs is `ps -q [-a] [--no-trunc] [--filter k=v]...`.
type dockerPs struct {
	all, noTrunc bool
	filters      [][2]string
}

func parsePs(args []string) (*dockerPs, bool) {
	p := &dockerPs{}
	quiet := false
	for i := 0; i < len(args); i++ {
		name, inline := longFlag(args[i])
		switch {
		case inline == nil && (name == "-a" || name == "--all"):
			p.all = true
		case inline == nil && (name == "-q" || name == "--quiet"):
			quiet = true
		case inline == nil && (name == "-aq" || name == "-qa"):
			p.all, quiet = true, true
		case inline == nil && name == "--no-trunc":
			p.noTrunc = true
		case name == "--filter" || name == "-f":
			v, ok := flagValue(args, &i, inline)
			if !ok {
				return nil, false
			}
			// The CLI lower-cases and trims the key and trims the value;
			// only filters it takes as they are are done here.
			k, val, ok := strings.Cut(v, "=")
			if !ok || k == "" || k != strings.ToLower(strings.TrimSpace(k)) || val != strings.TrimSpace(val) {
				return nil, false
			}
			p.filters = append(p.filters, [2]string{k, val})
		default:
			return nil, false
		}
	}
	// Without -q the CLI prints a table: left to it.
	if !quiet {
		return nil, false
	}
	return p, true
}

// ---------------------------------------------------------------- run -d

// configs are the create request of the 20.10 CLI for these flags: its
// empty maps and lists where it sends them (Labels, Volumes, Dns, ...) and
// its defaults (restart "no", MemorySwappiness -1, NetworkMode "default"),
// so that the container is the one the CLI would have made.
func (r *dockerRun) configs() (*container.Config, *container.HostConfig, *network.NetworkingConfig) {
	labels := map[string]string{}
	for _, l := range r.labels {
		k, v, _ := strings.Cut(l, "=")
		labels[k] = v
	}
	cfg := &container.Config{
		Image:       r.image,
		Cmd:         r.cmd,
		Labels:      labels,
		Volumes:     map[string]struct{}{},
		StopTimeout: r.stopTimeout,
	}
	netMode, restart := r.network, r.restart
	if netMode == "" {
		netMode = "default"
	}
	if restart == "" {
		restart = "no"
	}
	swappiness, oomKillDisable, pidsLimit := int64(-1), false, int64(0)
	hc := &container.HostConfig{
		LogConfig:     container.LogConfig{Config: map[string]string{}},
		NetworkMode:   container.NetworkMode(netMode),
		PortBindings:  nat.PortMap{},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyMode(restart)},
		DNS:           []string{},
		DNSOptions:    []string{},
		DNSSearch:     []string{},
		Resources: container.Resources{
			BlkioWeightDevice: []*blkiodev.WeightDevice{},
			Devices:           []container.DeviceMapping{},
			MemorySwappiness:  &swappiness,
			OomKillDisable:    &oomKillDisable,
			PidsLimit:         &pidsLimit,
		},
	}
	nc := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{}}
	// The CLI sends an endpoint only when it has something to say.
	if r.ip != "" || r.ip6 != "" {
		nc.EndpointsConfig[r.network] = &network.EndpointSettings{
			IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: r.ip, IPv6Address: r.ip6},
		}
	}
	return cfg, hc, nc
}

// do creates and starts the container and prints its ID, as `docker run
// -d`; a failure is told as the CLI tells it (its runContainer).
func (r *dockerRun) do(ctx context.Context, c *client.Client) (string, string, error) {
	cfg, hc, nc := r.configs()
	created, err := c.ContainerCreate(ctx, cfg, hc, nc, nil, r.name)
	if err != nil {
		if ctx.Err() != nil {
			return "", "", ctx.Err()
		}
		if !fromDaemon(err) || cerrdefs.IsNotFound(err) {
			// Nothing created. A missing image the CLI would pull
			// ("Unable to find image ... locally"); a failure to reach
			// the daemon it tells in its own words.
			return "", "", errUseCLI
		}
		return "", runError(err, true), runStatus(err)
	}
	var stderr strings.Builder
	for _, w := range created.Warnings {
		fmt.Fprintf(&stderr, "WARNING: %s\n", w)
	}
	// The CLI prints the ID before it starts the container, and leaves the
	// container behind when the start fails.
	stdout := created.ID + "\n"
	if err := c.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		if ctx.Err() != nil {
			return stdout, stderr.String(), ctx.Err()
		}
		return stdout, stderr.String() + runError(err, false), runStatus(err)
	}
	return stdout, "", nil
}

// runError is the CLI's reportError.
func runError(err error, withHelp bool) string {
	s := strings.TrimSuffix(err.Error(), ".") + "."
	if withHelp {
		s += "\nSee 'docker run --help'."
	}
	return "docker: " + s + "\n"
}

// runStatus is the CLI's runStartContainerErr: 127 for a command not
// found, 126 for one not allowed, else 125.
func runStatus(err error) exitStatus {
	msg := strings.TrimPrefix(err.Error(), "Error response from daemon: ")
	switch {
	case strings.Contains(msg, "executable file not found"),
		strings.Contains(msg, "no such file or directory"),
		strings.Contains(msg, "system cannot find the file specified"):
		return 127
	case strings.Contains(msg, "permission denied"):
		return 126
	}
	return 125
}

// ---------------------------------------------------------------- exec

// do runs the command in the container as `docker exec`: stdout and stderr
// apart, the command's exit status as the CLI's.
func (e *dockerExec) do(ctx context.Context, c *client.Client) (string, string, error) {
	// The CLI inspects first, so that a missing container is said so.
	if _, err := c.ContainerInspect(ctx, e.container); err != nil {
		switch {
		case ctx.Err() != nil:
			return "", "", ctx.Err()
		case !fromDaemon(err):
			return "", "", errUseCLI
		case cerrdefs.IsNotFound(err):
			return "", noSuchContainer(e.container) + "\n", exitStatus(1)
		}
		return "", err.Error() + "\n", exitStatus(1)
	}
	failed := func(stdout, stderr string, err error) (string, string, error) {
		if ctx.Err() != nil {
			return stdout, stderr, ctx.Err()
		}
		return stdout, stderr + err.Error() + "\n", exitStatus(1)
	}
	created, err := c.ContainerExecCreate(ctx, e.container, container.ExecOptions{
		Cmd:          e.cmd,
		AttachStdout: !e.detach,
		AttachStderr: !e.detach,
		Detach:       e.detach, //nolint:staticcheck // the CLI sends it
	})
	if err != nil {
		return failed("", "", err)
	}
	if created.ID == "" {
		return failed("", "", errors.New("exec ID empty"))
	}
	if e.detach {
		if err := c.ContainerExecStart(ctx, created.ID, container.ExecStartOptions{Detach: true}); err != nil {
			return failed("", "", err)
		}
		return "", "", nil
	}
	resp, err := c.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return failed("", "", err)
	}
	defer resp.Close()
	var stdout, stderr bytes.Buffer
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(&stdout, &stderr, resp.Reader)
		copied <- err
	}()
	select {
	case err = <-copied:
	case <-ctx.Done():
		resp.Close() // ends the copy
		<-copied
		return stdout.String(), stderr.String(), ctx.Err()
	}
	if err != nil {
		return failed(stdout.String(), stderr.String(), err)
	}
	res, err := c.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		if client.IsErrConnectionFailed(err) && ctx.Err() == nil {
			return stdout.String(), stderr.String(), exitStatus(255) // the CLI's os.Exit(-1)
		}
		return failed(stdout.String(), stderr.String(), err)
	}
	// The CLI exits with the command's status; the kernel keeps 8 bits.
	if st := res.ExitCode & 0xff; st != 0 {
		return stdout.String(), stderr.String(), exitStatus(st)
	}
	return stdout.String(), stderr.String(), nil
}

// ---------------------------------------------------------------- rm -f

// do removes the containers at once, as the CLI does, and tells the
// result in the order given: the names removed on stdout, a missing one
// on stderr (with -f not a failure), any other failure on stderr with
// exit status 1.
func (r *dockerRm) do(ctx context.Context, c *client.Client) (string, string, error) {
	errs := make([]error, len(r.names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50) // the CLI's parallelOperation
	for i, name := range r.names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.ContainerRemove(ctx, name, container.RemoveOptions{Force: true, RemoveVolumes: r.volumes})
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return "", "", ctx.Err()
	}
	var stdout, stderr strings.Builder
	var failures []string
	reached := false
	for i, err := range errs {
		switch {
		case err == nil:
			reached = true
			stdout.WriteString(r.names[i] + "\n")
		case !fromDaemon(err):
			failures = append(failures, err.Error())
		case cerrdefs.IsNotFound(err):
			reached = true
			stderr.WriteString(noSuchContainer(r.names[i]) + "\n")
		default:
			reached = true
			failures = append(failures, err.Error())
		}
	}
	if !reached {
		// Not one removal reached the daemon: nothing changed, and the
		// CLI says why in its words.
		return "", "", errUseCLI
	}
	if len(failures) > 0 {
		stderr.WriteString(strings.Join(failures, "\n") + "\n")
		return stdout.String(), stderr.String(), exitStatus(1)
	}
	return stdout.String(), stderr.String(), nil
}

// ---------------------------------------------------------------- inspect -f

// templateFuncs are the CLI's (its templates.basicFunctions); text/template
// brings println, index, len, ...
var templateFuncs = template.FuncMap{
	"json": func(v any) string {
		buf := &bytes.Buffer{}
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		return strings.TrimSpace(buf.String())
	},
	"split":    strings.Split,
	"join":     strings.Join,
	"title":    strings.Title, //nolint:staticcheck // what the CLI uses
	"lower":    strings.ToLower,
	"upper":    strings.ToUpper,
	"pad":      padWithSpace,
	"truncate": truncateWithLength,
}

func padWithSpace(source string, prefix, suffix int) string {
	if source == "" {
		return source
	}
	return strings.Repeat(" ", prefix) + source + strings.Repeat(" ", suffix)
}

func truncateWithLength(source string, length int) string {
	if len(source) < length {
		return source
	}
	return source[:length]
}

// do executes the template on each container as the CLI's
// TemplateInspector: on the typed inspect result, and on the raw JSON
// (missingkey=error, from then on for every name) when that fails.
//
// The typed result here is the newer client's, which has fields the 20.10
// one has not (e.g. NetworkSettings.Networks.*.GwPriority, and KernelMemory
// omitted when zero): a template that reaches them would print what the
// CLI does not. Hence a typed result is used only when the raw JSON - the
// daemon's own fields - gives the same text; otherwise, and on any error,
// the CLI answers the whole command.
func (in *dockerInspect) do(ctx context.Context, c *client.Client) (string, string, error) {
	typed, err := template.New("").Funcs(templateFuncs).Parse(in.format)
	if err != nil {
		return "", "", errUseCLI
	}
	check := template.Must(typed.Clone()).Option("missingkey=error")
	var out bytes.Buffer
	for _, name := range in.names {
		ctr, raw, err := c.ContainerInspectWithRaw(ctx, name, false)
		if err != nil {
			if ctx.Err() != nil {
				return "", "", ctx.Err()
			}
			// Not a container (the CLI goes on to images, networks,
			// ...), or an error the CLI tells in its words.
			return "", "", errUseCLI
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var rawValue any
		if err := dec.Decode(&rawValue); err != nil {
			return "", "", errUseCLI
		}
		var typedOut, rawOut bytes.Buffer
		rawErr := check.Execute(&rawOut, rawValue)
		if err := typed.Execute(&typedOut, ctr); err != nil {
			typed.Option("missingkey=error") // as the CLI, for the next names too
			if rawErr != nil {
				return "", "", errUseCLI
			}
		} else if rawErr != nil || typedOut.String() != rawOut.String() {
			return "", "", errUseCLI
		}
		out.Write(rawOut.Bytes()) // the same text as the typed one, or the CLI's fallback
		out.WriteByte('\n')
	}
	return out.String(), "", nil
}

// ---------------------------------------------------------------- ps -q

// do lists the container IDs as `docker ps -q`, in the daemon's order.
func (p *dockerPs) do(ctx context.Context, c *client.Client) (string, string, error) {
	f := filters.NewArgs()
	for _, kv := range p.filters {
		f.Add(kv[0], kv[1])
	}
	list, err := c.ContainerList(ctx, container.ListOptions{All: p.all, Filters: f})
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return "", "", ctx.Err()
		case !fromDaemon(err):
			return "", "", errUseCLI
		}
		return "", err.Error() + "\n", exitStatus(1)
	}
	var out strings.Builder
	for _, ctr := range list {
		id := ctr.ID
		if !p.noTrunc && len(id) > 12 { // the CLI's stringid.TruncateID
			id = id[:12]
		}
		out.WriteString(id + "\n")
	}
	return out.String(), "", nil
}
