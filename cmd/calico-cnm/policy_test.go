package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// TestCLIPolicy: apply, get (table, yaml that applies back unchanged,
// json), delete; a bad file names the field and applies nothing; get
// endpoints shows labels and the selecting policies.
func TestCLIPolicy(t *testing.T) {
	m, ep := startEtcd(t)
	store := m.Client(t)
	dir := t.TempDir()
	tier, err := os.ReadFile("../../policy/api/testdata/three-tier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "three-tier.yaml")
	mustWrite(t, good, string(tier))
	// The second document is bad: the first must not be applied either.
	bad := filepath.Join(dir, "bad.yaml")
	mustWrite(t, bad, strings.Replace(string(tier), "three-tier", "other", 1)+"---\n"+strings.Replace(strings.Replace(string(tier), "three-tier", "third", 1), "[8080]", "[0]", 1))
	var printed string
	runSteps(t, nil, []step{
		{name: "apply needs -f", args: withEtcd(ep, "apply"), code: exitUsage, stderr: "apply needs -f FILE"},
		{name: "bad file", args: withEtcd(ep, "apply", "-f", bad), code: exitFailed, stderr: "document 2: spec.ingress[0].destination.ports[0]: 0 is not a port"},
		{name: "nothing half-applied", args: withEtcd(ep, "get", "policy"), stdout: "NAME  ORDER  SELECTOR  TYPES  INGRESS  EGRESS\n"},
		{name: "apply", args: withEtcd(ep, "apply", "-f", good), stdout: "globalnetworkpolicy \"three-tier\" created\n"},
		{name: "apply again", args: withEtcd(ep, "apply", "-f", good), stdout: "globalnetworkpolicy \"three-tier\" configured\n"},
		{name: "table", args: withEtcd(ep, "get", "policy"),
			stdout: "NAME        ORDER  SELECTOR   TYPES    INGRESS  EGRESS\nthree-tier  100    has(role)  Ingress  3        0\n"},
		{name: "yaml", args: withEtcd(ep, "get", "policy", "three-tier", "-o", "yaml"), check: func(t *testing.T, r result) {
			printed = r.stdout
			if !strings.HasPrefix(r.stdout, "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\n") {
				t.Errorf("yaml:\n%s", r.stdout)
			}
		}},
		{name: "json list", args: withEtcd(ep, "get", "policy", "-o", "json"), stdout: "~\"kind\": \"GlobalNetworkPolicyList\""},
		{name: "missing", args: withEtcd(ep, "get", "policy", "nope"), code: exitFailed, stderr: "no such policy"},
	})
	// What -o yaml printed applies back to the same record.
	before, err := store.Get(context.Background(), api.PolicyKey("three-tier"))
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "printed.yaml")
	mustWrite(t, again, printed)
	runSteps(t, nil, []step{{name: "round trip", args: withEtcd(ep, "apply", "-f", again), stdout: "globalnetworkpolicy \"three-tier\" configured\n"}})
	after, err := store.Get(context.Background(), api.PolicyKey("three-tier"))
	if err != nil || string(after.Value) != string(before.Value) {
		t.Errorf("round trip changed the record:\n%s\n%s", before.Value, after.Value)
	}

	// Endpoints: labels and which policies select them.
	netID := strings.Repeat("a", 64)
	if err := store.Txn(context.Background(),
		datastore.Create(datastore.NetworkKey(netID), datastore.MustJSON(datastore.Network{ID: netID, Name: "net1", Options: map[string]string{"calico.bandwidth.egress": "10mbit"}})),
		datastore.Create(datastore.EndpointKey("h1", "e1"), datastore.MustJSON(datastore.Endpoint{ID: "e1", Network: netID, IPv4: "10.0.0.1/32", Joined: true, Labels: map[string]string{"role": "db"},
			Ports: []datastore.PortBinding{{Proto: "tcp", HostPort: 18080, Port: 8080}}, BandwidthOptions: map[string]string{"org.projectcalico.bandwidth.ingress": "50mbit"}})),
		datastore.Create(datastore.EndpointKey("h2", "e2"), datastore.MustJSON(datastore.Endpoint{ID: "e2", Network: netID, IPv4: "10.0.0.2/32", Joined: true, LabelsUnknown: true})),
	); err != nil {
		t.Fatal(err)
	}
	runSteps(t, nil, []step{
		{name: "endpoints wide", args: withEtcd(ep, "get", "endpoints", "-o", "wide"),
			stdout: "NODE  ENDPOINT  NETWORK  ADDRESSES    LABELS                          INGRESS POLICIES  EGRESS POLICIES  PORTS                      BANDWIDTH\n" +
				"h1    e1        net1     10.0.0.1/32  role=db                         three-tier        -                8080/tcp -> 0.0.0.0:18080  ingress 50mbit, egress 10mbit\n" +
				"h2    e2        net1     10.0.0.2/32  (unknown: matches no selector)  -                 -                -                          egress 10mbit\n"},
		{name: "delete", args: withEtcd(ep, "delete", "policy", "three-tier"), stdout: "globalnetworkpolicy \"three-tier\" deleted\n"},
		{name: "delete again", args: withEtcd(ep, "delete", "policy", "three-tier"), code: exitFailed, stderr: "no such policy"},
	})
}

func mustWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(fmt.Errorf("writing %s: %w", path, err))
	}
}
