package policy

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
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

// DriverOptLabels are the labels given as endpoint driver options, the
// CreateEndpoint options whose key has LabelPrefix:
//
//	docker network connect --driver-opt org.projectcalico.label.role=web net1 c1
//
// A name or value Calico would not accept as a label is an error.
func DriverOptLabels(opts map[string]interface{}) (map[string]string, error) {
	var out map[string]string
	for k, raw := range opts {
		name, ok := strings.CutPrefix(k, LabelPrefix)
		if !ok {
			continue
		}
		v, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("driver option %s: the label value must be a string, not %T", k, raw)
		}
		if err := validLabel(name, v); err != nil {
			return nil, fmt.Errorf("driver option %s=%s: %w", k, v, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
	}
	return out, nil
}

// labelName and labelValue are Calico's (Kubernetes') label syntax: a
// name is an optional DNS prefix and "/" then up to 63 alphanumerics,
// '-', '_' or '.', beginning and ending with an alphanumeric; a value is
// the same without prefix, or empty.
var (
	labelName  = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

// ErrInvalidLabel: a label name or value Calico would not accept.
var ErrInvalidLabel = errors.New("invalid label")

func validLabel(name, value string) error {
	if !labelName.MatchString(name) {
		return fmt.Errorf("%w: name %q (up to 63 letters, digits, '-', '_' or '.', after an optional DNS prefix and '/')", ErrInvalidLabel, name)
	}
	if !labelValue.MatchString(value) {
		return fmt.Errorf("%w: value %q (up to 63 letters, digits, '-', '_' or '.', or empty)", ErrInvalidLabel, value)
	}
	if strings.HasPrefix(name, implicitNamespace) {
		return fmt.Errorf("%w: %s labels are set by calico-cnm", ErrInvalidLabel, implicitNamespace)
	}
	return nil
}

// implicitNamespace prefixes the implicit labels (LabelNetwork, ...).
const implicitNamespace = "projectcalico.org/"

// WithDriverLabels is labels (from EndpointLabels) with the endpoint's
// driver-option labels added; they override the container's explicit
// labels of the same name (they are given for this one endpoint), never an
// implicit one.
func WithDriverLabels(labels, driver map[string]string) map[string]string {
	if len(driver) == 0 {
		return labels
	}
	out := make(map[string]string, len(labels)+len(driver))
	for k, v := range driver {
		out[k] = v
	}
	for k, v := range labels {
		if _, set := out[k]; !set || strings.HasPrefix(k, implicitNamespace) {
			out[k] = v
		}
	}
	return out
}
