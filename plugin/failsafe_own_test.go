package plugin

import (
	"slices"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/routing"
)

func TestWithOwnPorts(t *testing.T) {
	def := policy.DefaultFailsafe()
	ports := func(s string) []policy.FailsafePort {
		p, err := policy.ParseFailsafePorts(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name        string
		fs          policy.Failsafe
		cfg         Config
		wantIn      []policy.FailsafePort
		wantOut     []policy.FailsafePort
		wantMissing []policy.FailsafePort
	}{
		{
			name:    "defaults: nothing added",
			fs:      def,
			cfg:     Config{BGP: routing.Config{Enabled: true, Port: 179}, Datastore: datastore.Config{Embedded: true, EmbeddedClientURL: "unix:///run/c.sock", EmbeddedPeerURL: "unix:///run/p.sock"}},
			wantIn:  def.Inbound,
			wantOut: def.Outbound,
		},
		{
			name: "BGP port and etcd on other ports",
			fs:   policy.Failsafe{Inbound: ports("tcp:22"), Outbound: ports("udp:53")},
			cfg: Config{BGP: routing.Config{Enabled: true, Port: 1179}, Datastore: datastore.Config{
				Embedded: true, EmbeddedClientURL: "http://10.0.0.1:12379", EmbeddedPeerURL: "http://10.0.0.1:12380",
				Endpoints: []string{"https://10.0.0.9:22379"}}},
			wantIn:  ports("tcp:22,tcp:1179,tcp:12379,tcp:12380"),
			wantOut: ports("udp:53,tcp:1179,tcp:12380,tcp:22379"),
		},
		{
			name:        "BGP off: its port is not opened",
			fs:          policy.Failsafe{Inbound: ports("tcp:22"), Outbound: ports("udp:53")},
			cfg:         Config{BGP: routing.Config{Enabled: false, Port: 1179}},
			wantIn:      ports("tcp:22"),
			wantMissing: ports("tcp:1179"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withOwnPorts(tc.fs, tc.cfg)
			if !slices.Equal(got.Inbound, tc.wantIn) {
				t.Errorf("inbound %v, want %v", got.Inbound, tc.wantIn)
			}
			if tc.wantOut != nil && !slices.Equal(got.Outbound, tc.wantOut) {
				t.Errorf("outbound %v, want %v", got.Outbound, tc.wantOut)
			}
			for _, p := range tc.wantMissing {
				if slices.Contains(got.Inbound, p) || slices.Contains(got.Outbound, p) {
					t.Errorf("%v opened: %v", p, got)
				}
			}
		})
	}
	// "none" stays none: the user asked for no failsafe ports.
	if got := withOwnPorts(policy.Failsafe{}, Config{BGP: routing.Config{Enabled: true, Port: 1179}}); len(got.Inbound)+len(got.Outbound) != 0 {
		t.Errorf("empty failsafe lists gained ports: %v", got)
	}
}
