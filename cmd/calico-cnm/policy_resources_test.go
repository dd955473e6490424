package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/policy/api"
)

const mixedResources = `apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: host1-eth0
  labels: {role: docker-host}
spec: {node: host1, interfaceName: eth0, expectedIPs: [10.0.0.11]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata:
  name: office
  labels: {clients: office}
spec: {nets: [10.0.0.0/24, 10.0.1.7]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-from-office}
spec:
  selector: role == 'docker-host'
  preDNAT: true
  applyOnForward: true
  ingress:
  - {action: Allow, protocol: TCP, source: {selector: "clients == 'office'"}, destination: {ports: [8080]}}
`

// TestCLIHostEndpointsAndNetworkSets: apply of the three kinds in one
// file (a bad document applies none of them), get in each format with
// -o yaml applying back to the same records, delete.
func TestCLIHostEndpointsAndNetworkSets(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "mixed.yaml")
	mustWrite(t, good, mixedResources)
	bad := filepath.Join(dir, "bad.yaml")
	mustWrite(t, bad, mixedResources+"---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: nodnat}\nspec:\n  preDNAT: true\n  ingress: [{action: Allow}]\n")
	printed := map[string]string{}
	runSteps(t, nil, []step{
		{name: "bad file", args: withEtcd(ep, "apply", "-f", bad), code: exitFailed, stderr: "document 4: spec.applyOnForward: must be true when preDNAT is true"},
		{name: "nothing half-applied", args: withEtcd(ep, "get", "hostendpoint"), stdout: "NAME  NODE  INTERFACE  EXPECTED IPS  LABELS\n"},
		{name: "apply", args: withEtcd(ep, "apply", "-f", good),
			stdout: "globalnetworkset \"office\" created\nhostendpoint \"host1-eth0\" created\nglobalnetworkpolicy \"web-from-office\" created\n"},
		{name: "hep table", args: withEtcd(ep, "get", "hostendpoint"),
			stdout: "NAME        NODE   INTERFACE  EXPECTED IPS  LABELS\nhost1-eth0  host1  eth0       10.0.0.11     role=docker-host\n"},
		{name: "gns wide", args: withEtcd(ep, "get", "globalnetworkset", "-o", "wide"),
			stdout: "NAME    NETS                     LABELS\noffice  10.0.0.0/24,10.0.1.7/32  clients=office\n"},
		{name: "hep yaml", args: withEtcd(ep, "get", "hostendpoint", "host1-eth0", "-o", "yaml"), check: func(t *testing.T, r result) { printed["hep"] = r.stdout }},
		{name: "gns yaml list", args: withEtcd(ep, "get", "gns", "-o", "yaml"), check: func(t *testing.T, r result) {
			if !strings.Contains(r.stdout, "kind: GlobalNetworkSetList") {
				t.Errorf("yaml:\n%s", r.stdout)
			}
			printed["gns"] = r.stdout
		}},
		{name: "policy yaml", args: withEtcd(ep, "get", "policy", "web-from-office", "-o", "yaml"), check: func(t *testing.T, r result) {
			if !strings.Contains(r.stdout, "preDNAT: true") || !strings.Contains(r.stdout, "applyOnForward: true") {
				t.Errorf("yaml:\n%s", r.stdout)
			}
		}},
		{name: "missing", args: withEtcd(ep, "get", "hostendpoint", "nope"), code: exitFailed, stderr: "host endpoint \"nope\": not found"},
	})
	// What -o yaml printed applies back to the same records.
	for kind, key := range map[string]string{"hep": api.HostEndpointKey("host1-eth0"), "gns": api.NetworkSetKey("office")} {
		before, err := store.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		again := filepath.Join(dir, kind+".yaml")
		mustWrite(t, again, printed[kind])
		runSteps(t, nil, []step{{name: kind + " round trip", args: withEtcd(ep, "apply", "-f", again), stdout: "~configured"}})
		after, err := store.Get(context.Background(), key)
		if err != nil || string(after.Value) != string(before.Value) {
			t.Errorf("%s round trip changed the record:\n%s\n%s", kind, before.Value, after.Value)
		}
	}
	runSteps(t, nil, []step{
		{name: "delete hep", args: withEtcd(ep, "delete", "hostendpoint", "host1-eth0"), stdout: "hostendpoint \"host1-eth0\" deleted\n"},
		{name: "delete gns", args: withEtcd(ep, "delete", "globalnetworkset", "office"), stdout: "globalnetworkset \"office\" deleted\n"},
		{name: "delete again", args: withEtcd(ep, "delete", "gns", "office"), code: exitFailed, stderr: "network set \"office\": not found"},
	})
}
