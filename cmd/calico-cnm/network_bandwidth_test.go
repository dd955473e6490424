package main

import (
	"context"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// TestCLINetworkBandwidth: `network bandwidth` shows a network's defaults,
// changes them in its record (by name or id prefix), removes one with
// "none", and refuses a bad value without writing anything.
func TestCLINetworkBandwidth(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	netID := strings.Repeat("b", 64)
	if err := store.Txn(context.Background(), datastore.Create(datastore.NetworkKey(netID), datastore.MustJSON(datastore.Network{
		ID: netID, Name: "net1", Options: map[string]string{"calico.bandwidth.ingress": "100mbit", "mtu": "1400"}}))); err != nil {
		t.Fatal(err)
	}
	options := func(t *testing.T) map[string]string {
		var n datastore.Network
		if _, err := store.GetJSON(context.Background(), datastore.NetworkKey(netID), &n); err != nil {
			t.Fatal(err)
		}
		return n.Options
	}
	runSteps(t, nil, []step{
		{name: "show", args: withEtcd(ep, "network", "bandwidth", "net1"), stdout: "network net1: bandwidth defaults ingress 100mbit\n"},
		{name: "set by id prefix", args: withEtcd(ep, "network", "bandwidth", "bbbb", "--ingress", "none", "--egress", "30mbit", "--egress-burst", "64k"),
			stdout: "network net1: bandwidth defaults egress 30mbit burst 64k\n",
			check: func(t *testing.T, _ result) {
				o := options(t)
				if o["calico.bandwidth.egress"] != "30mbit" || o["calico.bandwidth.egress-burst"] != "64k" || o["mtu"] != "1400" {
					t.Errorf("options after the change: %v", o)
				}
				if _, ok := o["calico.bandwidth.ingress"]; ok {
					t.Errorf("ingress default not removed: %v", o)
				}
			}},
		{name: "bad value", args: withEtcd(ep, "network", "bandwidth", "net1", "--egress", "50 mbits"), code: exitFailed,
			stderr: `network option calico.bandwidth.egress="50 mbits"`,
			check: func(t *testing.T, _ result) {
				if o := options(t); o["calico.bandwidth.egress"] != "30mbit" {
					t.Errorf("a refused value changed the record: %v", o)
				}
			}},
		{name: "unknown network", args: withEtcd(ep, "network", "bandwidth", "nope"), code: exitFailed, stderr: `no calico network "nope"`},
	})
}
