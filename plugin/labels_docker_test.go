package plugin

import (
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
)

// The joining container is recognised by the network it asked for, by
// name or id, in Docker's listing.
func TestOnNetwork(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	withMode := func(mode string) container.Summary {
		var c container.Summary
		c.HostConfig.NetworkMode = mode
		return c
	}
	withNet := func(key, netID string) container.Summary {
		return container.Summary{NetworkSettings: &container.NetworkSettingsSummary{Networks: map[string]*network.EndpointSettings{key: {NetworkID: netID}}}}
	}
	tests := []struct {
		name string
		c    container.Summary
		want bool
	}{
		{"--net by name", withMode("net1"), true},
		{"--net by id", withMode(id), true},
		{"--net by short id", withMode(id[:12]), true},
		{"too short a prefix", withMode(id[:4]), false},
		{"another network", withMode("net2"), false},
		{"default bridge", withMode("default"), false},
		{"listed network by name", withNet("net1", ""), true},
		{"listed network by id", withNet("renamed", id), true},
		{"listed other network", withNet("net2", "ffff"), false},
		{"nothing", container.Summary{}, false},
	}
	for _, tc := range tests {
		if got := onNetwork(tc.c, id, "net1"); got != tc.want {
			t.Errorf("%s: onNetwork = %v, want %v", tc.name, got, tc.want)
		}
	}
	// An unnamed network matches by id only.
	if onNetwork(withMode(""), id, "") {
		t.Error("empty network mode matched an unnamed network")
	}
}
