package policy

import (
	"maps"
	"strings"

	"github.com/calico-cnm/calico-cnm/bandwidth"
)

// Endpoint labels: what selectors see of a container.
//
// Explicit labels are the container's Docker labels with the prefix
// LabelPrefix (Calico's own Docker convention):
//
//	docker run --label org.projectcalico.label.role=frontend ...
//
// gives the endpoint the label role=frontend. The implicit labels, set on
// every endpoint where known, use Calico's projectcalico.org/ namespace;
// an explicit label never overrides them.
const (
	// LabelPrefix marks the Docker labels that become endpoint labels.
	LabelPrefix = "org.projectcalico.label."
	// LabelNetwork is the Docker network's name.
	LabelNetwork = "projectcalico.org/network"
	// LabelContainer is the container's name (without Docker's "/").
	LabelContainer = "projectcalico.org/container"
	// LabelComposeProject and LabelComposeService come from docker-compose's
	// com.docker.compose.project/service labels.
	LabelComposeProject = "projectcalico.org/compose-project"
	LabelComposeService = "projectcalico.org/compose-service"
	// LabelSwarmService is the swarm service of a task's container.
	LabelSwarmService = "projectcalico.org/swarm-service"
)

// Docker's own labels the implicit ones come from.
var implicitFrom = map[string]string{
	"com.docker.compose.project":    LabelComposeProject,
	"com.docker.compose.service":    LabelComposeService,
	"com.docker.swarm.service.name": LabelSwarmService,
}

// EndpointLabels computes an endpoint's labels from its container's Docker
// labels and name and its network's name.
func EndpointLabels(dockerLabels map[string]string, containerName, networkName string) map[string]string {
	out := map[string]string{}
	for k, v := range dockerLabels {
		if name, ok := strings.CutPrefix(k, LabelPrefix); ok && name != "" {
			out[name] = v
		}
	}
	for from, to := range implicitFrom {
		if v, ok := dockerLabels[from]; ok && v != "" {
			out[to] = v
		}
	}
	// The container's bandwidth labels ride along: the network driver
	// shapes the endpoint from them (at Join and whenever they are learnt).
	maps.Copy(out, bandwidth.EndpointLabels(dockerLabels))
	if n := strings.TrimPrefix(containerName, "/"); n != "" {
		out[LabelContainer] = n
	}
	if networkName != "" {
		out[LabelNetwork] = networkName
	}
	return out
}
