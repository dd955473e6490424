package policy

import (
	"reflect"
	"testing"
)

func TestEndpointLabels(t *testing.T) {
	got := EndpointLabels(map[string]string{
		"org.projectcalico.label.role":  "frontend",
		"org.projectcalico.label.":      "ignored",
		"other":                         "ignored",
		"com.docker.compose.project":    "shop",
		"com.docker.compose.service":    "web",
		"com.docker.swarm.service.name": "svc",
		// An explicit label cannot pose as an implicit one.
		"org.projectcalico.label.projectcalico.org/network": "fake",
	}, "/web-1", "net1")
	want := map[string]string{
		"role":              "frontend",
		LabelComposeProject: "shop",
		LabelComposeService: "web",
		LabelSwarmService:   "svc",
		LabelContainer:      "web-1",
		LabelNetwork:        "net1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("labels %v, want %v", got, want)
	}
}
