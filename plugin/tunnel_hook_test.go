package plugin

import (
	"testing"

	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/vxlan"
)

// The VXLAN filter (policy) must guard the port the device (vxlan) uses;
// policy cannot import vxlan, so the two constants are compared here.
func TestVXLANPortAgrees(t *testing.T) {
	if policy.VXLANPort != vxlan.Port {
		t.Fatalf("policy filters UDP %d, the VXLAN device uses %d", policy.VXLANPort, vxlan.Port)
	}
}
