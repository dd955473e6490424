package dataplane

import (
	"context"
	"fmt"
	"strings"
)

// SetRouteLocalnet switches net.ipv4.conf.<hostIfName>.route_localnet: on,
// a packet from 127.0.0.1 that DNAT sent to the workload may leave through
// its veth, and the workload's replies may come back (package ports, which
// also drops what the workload itself sends to 127.0.0.0/8).
func (l *Linux) SetRouteLocalnet(ctx context.Context, hostIfName string, on bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !strings.HasPrefix(hostIfName, HostIfPrefix) || strings.ContainsAny(hostIfName, "/.") {
		return fmt.Errorf("route_localnet: %q is not a workload interface", hostIfName)
	}
	v := "0"
	if on {
		v = "1"
	}
	return inNetNS(l.ns, l.log, func() error {
		return writeSysctls(l.procSys, []sysctl{{key: "net/ipv4/conf/" + hostIfName + "/route_localnet", value: v, onlyIfDifferent: true}})
	})
}
