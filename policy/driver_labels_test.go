package policy

import (
	"errors"
	"maps"
	"testing"
)

func TestDriverOptLabels(t *testing.T) {
	tests := []struct {
		name    string
		opts    map[string]interface{}
		want    map[string]string
		wantErr bool
		wantIs  error // the error wraps it (nil: any error)
	}{
		{"none", map[string]interface{}{"com.docker.network.portmap": nil}, nil, false, nil},
		{"labels", map[string]interface{}{LabelPrefix + "role": "web", LabelPrefix + "example.com/tier": "", "other": "x"}, map[string]string{"role": "web", "example.com/tier": ""}, false, nil},
		{"not a string", map[string]interface{}{LabelPrefix + "role": 1.0}, nil, true, nil},
		{"empty name", map[string]interface{}{LabelPrefix: "web"}, nil, true, ErrInvalidLabel},
		{"space in value", map[string]interface{}{LabelPrefix + "role": "a b"}, nil, true, ErrInvalidLabel},
		{"too long", map[string]interface{}{LabelPrefix + "role": string(make([]byte, 64))}, nil, true, ErrInvalidLabel},
		{"implicit", map[string]interface{}{LabelPrefix + LabelContainer: "c"}, nil, true, ErrInvalidLabel},
	}
	for _, tc := range tests {
		got, err := DriverOptLabels(tc.opts)
		if tc.wantErr {
			if err == nil || tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("%s: err %v, want an error wrapping %v", tc.name, err, tc.wantIs)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// A driver-option label overrides the container's explicit label of the
// same name, never an implicit one.
func TestWithDriverLabels(t *testing.T) {
	labels := EndpointLabels(map[string]string{LabelPrefix + "role": "db", LabelPrefix + "tier": "2"}, "/c1", "net1")
	got := WithDriverLabels(labels, map[string]string{"role": "web", "zone": "a"})
	want := map[string]string{"role": "web", "tier": "2", "zone": "a", LabelContainer: "c1", LabelNetwork: "net1"}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := WithDriverLabels(labels, nil); !maps.Equal(got, labels) {
		t.Errorf("no driver labels: %v", got)
	}
}
