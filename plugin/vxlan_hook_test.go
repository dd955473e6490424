package plugin

import (
	"testing"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/routing"
)

// The VXLAN filter (policy) must guard the port the device (routing) uses;
// policy cannot import routing, so the two constants are compared here.
func TestVXLANPortAgrees(t *testing.T) {
	if policy.VXLANPort != routing.VXLANPort {
		t.Fatalf("policy filters UDP %d, the VXLAN device uses %d", policy.VXLANPort, routing.VXLANPort)
	}
}
