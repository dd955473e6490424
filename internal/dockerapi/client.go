// Package dockerapi is how the daemon talks to its Docker engine: one way
// to make a client, one bound on a call, the engine's identity.
package dockerapi

import (
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/client"
)

// NewClient talks to the Docker daemon at host (e.g.
// unix:///var/run/docker.sock; "" = $DOCKER_HOST, else that default),
// negotiating the API version so that dockerd 20.10 (API 1.41) works. It
// does not connect yet.
func NewClient(host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		// The client library accepts any scheme and fails only at the first
		// call; a typo should stop the daemon at startup instead.
		switch proto, _, _ := strings.Cut(host, "://"); proto {
		case "unix", "tcp", "http", "https":
		default:
			return nil, fmt.Errorf("docker host %q: use unix:///path/to/docker.sock or tcp://host:port", host)
		}
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker host %q: %w", host, err)
	}
	return cli, nil
}

// CallTimeout bounds one Docker call: a hung dockerd must not hang the
// loop that asked.
const CallTimeout = 15 * time.Second
