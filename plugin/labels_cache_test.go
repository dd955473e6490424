package plugin

import (
	"maps"
	"slices"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/ports"
)

const testNetID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Which starting containers may be the one joining a network.
func TestCandidates(t *testing.T) {
	web := portSet{"80/tcp": true}
	c := func(name string, running bool, p portSet, nets ...string) knownContainer {
		return knownContainer{ID: name + "-id", Name: name, Running: running, Networks: nets, Ports: p}
	}
	all := []knownContainer{
		c("by-name", false, nil, "net1"),
		c("by-id", false, nil, testNetID),
		c("by-short-id", false, nil, testNetID[:12]),
		c("too-short-a-prefix", false, nil, testNetID[:4]),
		c("running", true, nil, "net1"),
		c("other-net", false, nil, "net2"),
		c("same-ports", false, portSet{"80/tcp": true}, "net1"),
		c("other-ports", false, portSet{"443/tcp": true}, "net1"),
	}
	tests := []struct {
		name     string
		cs       []knownContainer
		ports    portSet
		want     []string
		complete bool
	}{
		{"by network name, id or short id; not running", all, nil, []string{"by-name", "by-id", "by-short-id", "same-ports", "other-ports"}, true},
		{"ports narrow where known", all, web, []string{"by-name", "by-id", "by-short-id", "same-ports"}, true},
		{"networks not known yet", append(slices.Clone(all), knownContainer{ID: "x", Name: "just-created"}), web, []string{"by-name", "by-id", "by-short-id", "same-ports"}, false},
		{"a running container is never one", []knownContainer{c("running", true, nil, "net1")}, nil, nil, true},
	}
	for _, tc := range tests {
		got, complete := candidates(tc.cs, testNetID, "net1", tc.ports)
		var names []string
		for _, g := range got {
			names = append(names, g.Name)
		}
		if !slices.Equal(names, tc.want) || complete != tc.complete {
			t.Errorf("%s: %v (complete %v), want %v (complete %v)", tc.name, names, complete, tc.want, tc.complete)
		}
	}
}

// Candidates whose labels differ only in the container's name give those
// labels; any other difference gives none.
func TestCommonLabels(t *testing.T) {
	web := map[string]string{policy.LabelPrefix + "role": "web", "com.docker.compose.service": "web"}
	c := func(name string, labels map[string]string) knownContainer {
		return knownContainer{Name: name, Labels: labels}
	}
	tests := []struct {
		name string
		cs   []knownContainer
		want map[string]string
		ok   bool
	}{
		{"replicas", []knownContainer{c("p_web_1", web), c("p_web_2", web)},
			map[string]string{"role": "web", policy.LabelComposeService: "web", policy.LabelNetwork: "net1"}, true},
		{"one", []knownContainer{c("p_web_1", web)},
			map[string]string{"role": "web", policy.LabelComposeService: "web", policy.LabelNetwork: "net1"}, true},
		{"another role", []knownContainer{c("p_web_1", web), c("p_db_1", map[string]string{policy.LabelPrefix + "role": "db"})}, nil, false},
		{"one more label", []knownContainer{c("a", web), c("b", map[string]string{policy.LabelPrefix + "role": "web", "com.docker.compose.service": "web", policy.LabelPrefix + "x": "y"})}, nil, false},
		{"none", nil, nil, false},
	}
	for _, tc := range tests {
		got, ok := commonLabels(tc.cs, "net1")
		if ok != tc.ok || !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// Join's options, as they come off the wire (JSON numbers), name the
// sandbox's ports.
func TestJoinPorts(t *testing.T) {
	opts := map[string]interface{}{
		ports.OptPortMap:      []interface{}{map[string]interface{}{"Proto": 6.0, "Port": 80.0, "HostPort": 8080.0}},
		ports.OptExposedPorts: []interface{}{map[string]interface{}{"Proto": 6.0, "Port": 80.0}, map[string]interface{}{"Proto": 17.0, "Port": 53.0}},
	}
	if got := joinPorts(opts); !maps.Equal(got, portSet{"80/tcp": true, "53/udp": true}) {
		t.Errorf("joinPorts = %v", got)
	}
	if got := joinPorts(map[string]interface{}{ports.OptPortMap: []interface{}{}, "x": "y"}); got != nil {
		t.Errorf("no ports: %v, want nil (not known)", got)
	}
}

// What Docker's listing says of a container.
func TestFromSummary(t *testing.T) {
	var s container.Summary
	s.ID, s.Names, s.State = "c1", []string{"/web"}, "running"
	s.Labels = map[string]string{"a": "b"}
	s.HostConfig.NetworkMode = "net1"
	s.NetworkSettings = &container.NetworkSettingsSummary{Networks: map[string]*network.EndpointSettings{"net2": {NetworkID: testNetID}}}
	s.Ports = []container.Port{{PrivatePort: 80, Type: "tcp"}}
	got := fromSummary(s)
	if got.Name != "web" || !got.Running || !got.asksFor(testNetID, "other") || !got.asksFor("x", "net1") || !maps.Equal(got.Ports, portSet{"80/tcp": true}) {
		t.Errorf("fromSummary = %+v", got)
	}
	s.State, s.Ports, s.NetworkSettings, s.HostConfig.NetworkMode = "created", nil, nil, ""
	if got := fromSummary(s); got.Running || got.Networks == nil || got.Ports != nil {
		t.Errorf("a created container without networks: %+v (networks must be known-empty, ports unknown)", got)
	}
}
