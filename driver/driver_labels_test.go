package driver_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/policy"
)

// recordingLabels is a Labeller that remembers the requests it got.
type recordingLabels struct{ got []driver.LabelRequest }

func (r *recordingLabels) EndpointLabels(ctx context.Context, req driver.LabelRequest) (map[string]string, error) {
	r.got = append(r.got, req)
	return policy.WithDriverLabels(map[string]string{"role": "from-container", "tier": "1"}, req.DriverLabels), nil
}

// Labels given as endpoint driver options (docker network connect
// --driver-opt org.projectcalico.label.k=v) are recorded at CreateEndpoint,
// handed to the Labeller with Join's options, and override the
// container's label of the same name; a bad one fails CreateEndpoint and
// records nothing.
func TestDriverOptLabels(t *testing.T) {
	m := etcdtest.Start(t)
	e := newEnv(t, m.Store)
	rec := &recordingLabels{}
	e.nd = driver.NewNetworkDriver(m.Store, e.dp, testHost, quietLog(), driver.Options{IPAM: e.ipam, Labels: rec})
	netID := e.createNetwork(t, false)
	ctx := context.Background()

	id := newID('e')
	_, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{
		NetworkID: netID, EndpointID: id, Interface: &network.EndpointInterface{Address: "10.10.1.60/32"},
		Options: map[string]interface{}{policy.LabelPrefix + "role": "web", "com.docker.network.endpoint.exposedports": []interface{}{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ep, _ := e.endpoint(t, id); !maps.Equal(ep.DriverLabels, map[string]string{"role": "web"}) {
		t.Errorf("driver labels on the record: %v", ep.DriverLabels)
	}
	opts := map[string]interface{}{"com.docker.network.portmap": []interface{}{}}
	if _, err := e.nd.Join(ctx, &network.JoinRequest{NetworkID: netID, EndpointID: id, SandboxKey: "/var/run/docker/netns/dl", Options: opts}); err != nil {
		t.Fatal(err)
	}
	if len(rec.got) != 1 || rec.got[0].EndpointID != id || rec.got[0].Options == nil || rec.got[0].DriverLabels["role"] != "web" {
		t.Errorf("Labeller got %+v", rec.got)
	}
	if ep, _ := e.endpoint(t, id); !maps.Equal(ep.Labels, map[string]string{"role": "web", "tier": "1"}) || ep.LabelsUnknown {
		t.Errorf("labels on the record: %v (unknown %v)", ep.Labels, ep.LabelsUnknown)
	}

	for _, tc := range []struct {
		name string
		opts map[string]interface{}
	}{
		{"bad name", map[string]interface{}{policy.LabelPrefix + "-role": "web"}},
		{"bad value", map[string]interface{}{policy.LabelPrefix + "role": "a b"}},
		{"implicit label", map[string]interface{}{policy.LabelPrefix + policy.LabelNetwork: "x"}},
	} {
		id := newID('e')
		_, err := e.nd.CreateEndpoint(ctx, &network.CreateEndpointRequest{
			NetworkID: netID, EndpointID: id, Interface: &network.EndpointInterface{Address: "10.10.1.61/32"}, Options: tc.opts,
		})
		if !errors.Is(err, driver.ErrInvalidRequest) || !strings.Contains(err.Error(), policy.LabelPrefix) {
			t.Errorf("%s: CreateEndpoint: %v, want an invalid-request error naming the option", tc.name, err)
		}
		if _, ok := e.endpoint(t, id); ok {
			t.Errorf("%s: a refused endpoint was recorded", tc.name)
		}
	}
}
