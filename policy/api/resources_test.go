package api

import (
	"reflect"
	"strings"
	"testing"
)

const (
	hepHead = "apiVersion: projectcalico.org/v3\nkind: HostEndpoint\nmetadata: {name: h}\n"
	gnsHead = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {name: n}\n"
)

func TestDecodeResourceErrors(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"preDNAT without applyOnForward", head + "spec: {preDNAT: true, ingress: [{action: Deny}]}\n", []string{"spec.applyOnForward: must be true when preDNAT is true"}},
		{"preDNAT egress", head + "spec: {preDNAT: true, applyOnForward: true, egress: [{action: Deny}]}\n", []string{"spec.egress: pre-DNAT policy has ingress rules only"}},
		{"preDNAT type egress", head + "spec: {preDNAT: true, applyOnForward: true, types: [Egress]}\n", []string{"spec.types: pre-DNAT policy has type Ingress only"}},
		{"preDNAT not a bool", head + "spec: {preDNAT: yes please}\n", []string{"spec.preDNAT: must be true or false"}},
		{"hep without node", hepHead + "spec: {interfaceName: eth0}\n", []string{"spec.node: is required"}},
		{"hep without interface or ips", hepHead + "spec: {node: h1}\n", []string{"spec: give interfaceName, expectedIPs or both"}},
		{"hep bad interface", hepHead + "spec: {node: h1, interfaceName: eth0/1}\n", []string{`spec.interfaceName: "eth0/1": give an interface name`}},
		{"hep bad ip", hepHead + "spec: {node: h1, expectedIPs: [10.0.0.300]}\n", []string{`spec.expectedIPs[0]: "10.0.0.300" is not an IP address`}},
		{"hep unknown field", hepHead + "spec: {node: h1, interfaceName: eth0, profiles: [x]}\n", []string{"spec.profiles: unknown field"}},
		{"bad label key", "apiVersion: projectcalico.org/v3\nkind: HostEndpoint\nmetadata: {name: h, labels: {'a b': x}}\nspec: {node: h1, interfaceName: eth0}\n", []string{`metadata.labels.a b: "a b" is not a valid label key`}},
		{"bad label value", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {name: n, labels: {a: 'x y'}}\n", []string{`metadata.labels.a: "x y" is not a valid label value`}},
		{"policy labels", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p, labels: {a: b}}\n", []string{"metadata.labels: unknown field"}},
		{"gns bad net", gnsHead + "spec: {nets: [10.0.0.0/40]}\n", []string{`spec.nets[0]: "10.0.0.0/40" is not a CIDR`}},
		{"typed list, other kind", "apiVersion: projectcalico.org/v3\nkind: HostEndpointList\nitems:\n- " + strings.ReplaceAll(gnsHead, "\n", "\n  ") + "\n", []string{`items[0].kind: "GlobalNetworkSet" in a HostEndpointList`}},
		{"duplicate hep", hepHead + "spec: {node: h1, interfaceName: eth0}\n---\n" + hepHead + "spec: {node: h1, interfaceName: eth1}\n", []string{`document 2: metadata.name: host endpoint "h" is given twice`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeResources(strings.NewReader(tc.in))
			wantValidationError(t, err, tc.want)
		})
	}
}

// A List of every kind decodes; the same name may be used by different
// kinds; Decode (policies only) refuses the other kinds.
func TestDecodeResourcesMixedList(t *testing.T) {
	in := `apiVersion: projectcalico.org/v3
kind: List
items:
- apiVersion: projectcalico.org/v3
  kind: HostEndpoint
  metadata: {name: x, labels: {role: host}}
  spec: {node: h1, interfaceName: "*", expectedIPs: ["::ffff:10.0.0.1"]}
- apiVersion: projectcalico.org/v3
  kind: GlobalNetworkSet
  metadata: {name: x}
  spec: {nets: [10.1.2.3/16, 2001:db8::1]}
- apiVersion: projectcalico.org/v3
  kind: GlobalNetworkPolicy
  metadata: {name: x}
  spec: {preDNAT: true, applyOnForward: true, ingress: [{action: Deny}]}
`
	res, err := DecodeResources(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.HostEndpoints) != 1 || len(res.NetworkSets) != 1 || len(res.Policies) != 1 {
		t.Fatalf("got %+v", res)
	}
	if got := res.HostEndpoints[0].Spec.ExpectedIPs; !reflect.DeepEqual(got, []string{"10.0.0.1"}) {
		t.Errorf("expectedIPs %v", got)
	}
	if got := res.NetworkSets[0].Spec.Nets; !reflect.DeepEqual(got, []string{"10.1.0.0/16", "2001:db8::1/128"}) {
		t.Errorf("nets %v (want masked)", got)
	}
	if p := res.Policies[0]; !p.Spec.PreDNAT || !p.Spec.ApplyOnForward || !reflect.DeepEqual(p.Spec.Types, []PolicyType{Ingress}) {
		t.Errorf("policy %+v", p.Spec)
	}
	if _, err := Decode(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "only GlobalNetworkPolicy") {
		t.Errorf("Decode of other kinds: %v", err)
	}
	// What YAML prints of each decodes back equal.
	for _, v := range []any{res.HostEndpoints[0], res.NetworkSets[0]} {
		b, err := YAML(v)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeResources(strings.NewReader(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(again.HostEndpoints, res.HostEndpoints) && !reflect.DeepEqual(again.NetworkSets, res.NetworkSets) {
			t.Errorf("round trip of\n%s\ngave %+v", b, again)
		}
	}
}
