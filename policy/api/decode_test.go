package api

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func decodeString(t *testing.T, s string) ([]GlobalNetworkPolicy, error) {
	t.Helper()
	return Decode(strings.NewReader(s))
}

func TestDecodeThreeTier(t *testing.T) {
	f, err := os.Open("testdata/three-tier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps, err := Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("got %d policies, want 1", len(ps))
	}
	p := ps[0]
	if p.Metadata.Name != "three-tier" || p.Spec.Order == nil || *p.Spec.Order != 100 || p.Spec.Selector != "has(role)" {
		t.Errorf("metadata/spec: %+v", p)
	}
	if len(p.Spec.Ingress) != 3 || p.Spec.Ingress[0].Protocol.Num != 6 || p.Spec.Ingress[0].Destination.Ports[0] != (Port{8080, 8080}) {
		t.Errorf("ingress: %+v", p.Spec.Ingress)
	}
	if !reflect.DeepEqual(p.Spec.Types, []PolicyType{Ingress}) {
		t.Errorf("types %v", p.Spec.Types)
	}
}

// The YAML and JSON printed by `get policy` decode to the same policies.
func TestRoundTrip(t *testing.T) {
	in := `
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: a}
spec:
  order: 1.5
  selector: "app == 'x'"
  ingress:
  - action: Log
  - action: Allow
    ipVersion: 4
    protocol: udp
    source: {nets: [10.0.0.1, 10.1.0.0/16], notNets: ["10.1.2.0/24"], notSelector: "has(bad)"}
    destination: {ports: [53, "1000:2000"], notPorts: ["1500"]}
  - action: Allow
    protocol: ICMP
    icmp: {type: 8, code: 0}
  - action: Deny
    notProtocol: 17
  egress:
  - action: Pass
    protocol: 132
---
apiVersion: projectcalico.org/v3
kind: List
items:
- apiVersion: projectcalico.org/v3
  kind: GlobalNetworkPolicy
  metadata: {name: b}
  spec: {egress: [{action: Deny}]}
`
	ps, err := decodeString(t, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("%d policies", len(ps))
	}
	if got := ps[0].Spec.Ingress[1].Source.Nets; !reflect.DeepEqual(got, []string{"10.0.0.1/32", "10.1.0.0/16"}) {
		t.Errorf("nets not canonical: %v", got)
	}
	if !reflect.DeepEqual(ps[0].Spec.Types, []PolicyType{Ingress, Egress}) || !reflect.DeepEqual(ps[1].Spec.Types, []PolicyType{Egress}) {
		t.Errorf("defaulted types: %v %v", ps[0].Spec.Types, ps[1].Spec.Types)
	}
	if p := ps[0].Spec.Ingress[1].Protocol; p.Name != "UDP" {
		t.Errorf("protocol udp -> %v, want UDP", p)
	}
	if p := ps[0].Spec.Ingress[3].NotProtocol; p.Name != "UDP" {
		t.Errorf("notProtocol 17 -> %v, want UDP", p)
	}
	for _, enc := range []func(any) ([]byte, error){YAML, JSON} {
		out, err := enc(NewList(ps))
		if err != nil {
			t.Fatal(err)
		}
		again, err := Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("printed form does not decode: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again, ps) {
			t.Errorf("round trip changed the policies:\n%s\n%+v\n%+v", out, again, ps)
		}
	}
	// One policy alone too.
	out, _ := YAML(ps[1])
	if again, err := Decode(bytes.NewReader(out)); err != nil || !reflect.DeepEqual(again, ps[1:]) {
		t.Errorf("single policy round trip: %v\n%s", err, out)
	}
	// The datastore form.
	js, _ := JSON(ps[0])
	if st, err := DecodeStored(js); err != nil || !reflect.DeepEqual(st, ps[0]) {
		t.Errorf("stored round trip: %v", err)
	}
}

const head = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\n"

// Every invalid field is refused with its path.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // path: message fragments, all present
	}{
		{"unknown top field", head + "spek: {}\n", []string{"spek: unknown field"}},
		{"wrong apiVersion", "apiVersion: v1\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\n", []string{`apiVersion: "v1" is not supported`}},
		{"missing apiVersion", "kind: GlobalNetworkPolicy\nmetadata: {name: p}\n", []string{"apiVersion: is required"}},
		{"wrong kind", "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: p}\n", []string{`kind: "NetworkPolicy" is not supported`}},
		{"missing metadata", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\n", []string{"metadata: is required"}},
		{"missing name", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {}\n", []string{"metadata.name: is required"}},
		{"bad name", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: Bad_Name}\n", []string{"metadata.name:", "not a valid name"}},
		{"unknown metadata field", "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p, namespace: x}\n", []string{"metadata.namespace: unknown field"}},
		{"order not a number", head + "spec: {order: high}\n", []string{"spec.order: must be a number"}},
		{"bad selector", head + "spec: {selector: \"role = 'x'\"}\n", []string{"spec.selector: invalid selector", "position 5"}},
		{"bad type", head + "spec: {types: [Inbound]}\n", []string{`spec.types[0]: "Inbound": use Ingress or Egress`}},
		{"dup type", head + "spec: {types: [Ingress, Ingress]}\n", []string{`spec.types[1]: "Ingress" is given twice`}},
		{"rules without type", head + "spec: {types: [Ingress], egress: [{action: Allow}]}\n", []string{"spec.egress: egress rules are given but spec.types does not include Egress"}},
		{"ingress not a list", head + "spec: {ingress: {action: Allow}}\n", []string{"spec.ingress: must be a list"}},
		{"missing action", head + "spec: {ingress: [{protocol: TCP}]}\n", []string{"spec.ingress[0].action: is required"}},
		{"bad action", head + "spec: {ingress: [{action: Accept}]}\n", []string{`spec.ingress[0].action: "Accept": use Allow, Deny, Log or Pass`}},
		{"unknown rule field", head + "spec: {ingress: [{action: Allow, http: {}}]}\n", []string{"spec.ingress[0].http: unknown field"}},
		{"bad ipVersion", head + "spec: {ingress: [{action: Allow, ipVersion: 5}]}\n", []string{"spec.ingress[0].ipVersion: 5: use 4 or 6"}},
		{"bad protocol", head + "spec: {egress: [{action: Allow, protocol: QUIC}]}\n", []string{`spec.egress[0].protocol: "QUIC"`}},
		{"protocol 0", head + "spec: {egress: [{action: Allow, protocol: 0}]}\n", []string{"spec.egress[0].protocol: 0: protocol numbers are 1-255"}},
		{"bad notProtocol", head + "spec: {egress: [{action: Allow, notProtocol: 300}]}\n", []string{"spec.egress[0].notProtocol: 300"}},
		{"icmp without protocol", head + "spec: {ingress: [{action: Allow, icmp: {type: 8}}]}\n", []string{"spec.ingress[0].icmp: needs protocol ICMP or ICMPv6"}},
		{"icmp bad type", head + "spec: {ingress: [{action: Allow, protocol: ICMP, icmp: {type: 255}}]}\n", []string{"spec.ingress[0].icmp.type: 255: use 0-254"}},
		{"icmp bad code", head + "spec: {ingress: [{action: Allow, protocol: ICMP, icmp: {type: 3, code: 256}}]}\n", []string{"spec.ingress[0].icmp.code: 256: use 0-255"}},
		{"icmp code without type", head + "spec: {ingress: [{action: Allow, protocol: ICMP, icmp: {code: 1}}]}\n", []string{"spec.ingress[0].icmp.code: needs icmp.type"}},
		{"icmp unknown field", head + "spec: {ingress: [{action: Allow, protocol: ICMP, icmp: {kind: 1}}]}\n", []string{"spec.ingress[0].icmp.kind: unknown field"}},
		{"bad net", head + "spec: {ingress: [{action: Allow, source: {nets: [10.0.0.0/33]}}]}\n", []string{`spec.ingress[0].source.nets[0]: "10.0.0.0/33" is not a CIDR`}},
		{"bad notNet", head + "spec: {ingress: [{action: Allow, destination: {notNets: [foo]}}]}\n", []string{`spec.ingress[0].destination.notNets[0]: "foo"`}},
		{"net family", head + "spec: {ingress: [{action: Allow, ipVersion: 6, source: {nets: [10.0.0.0/8]}}]}\n", []string{"spec.ingress[0].source.nets[0]: 10.0.0.0/8 is not an IPv6 network"}},
		{"bad source selector", head + "spec: {ingress: [{action: Allow, source: {selector: 'has(a'}}]}\n", []string{"spec.ingress[0].source.selector: invalid selector"}},
		{"bad notSelector", head + "spec: {ingress: [{action: Allow, source: {notSelector: '&&'}}]}\n", []string{"spec.ingress[0].source.notSelector: invalid selector"}},
		{"ports without protocol", head + "spec: {ingress: [{action: Allow, destination: {ports: [80]}}]}\n", []string{"spec.ingress[0].destination.ports: needs protocol TCP, UDP, SCTP or UDPLite"}},
		{"ports with icmp", head + "spec: {ingress: [{action: Allow, protocol: ICMP, destination: {ports: [80]}}]}\n", []string{"spec.ingress[0].destination.ports: needs protocol"}},
		{"port 0", head + "spec: {ingress: [{action: Allow, protocol: TCP, destination: {ports: [0]}}]}\n", []string{"spec.ingress[0].destination.ports[0]: 0 is not a port"}},
		{"port too big", head + "spec: {ingress: [{action: Allow, protocol: TCP, destination: {ports: [80, 70000]}}]}\n", []string{"spec.ingress[0].destination.ports[1]: 70000 is not a port"}},
		{"named port", head + "spec: {ingress: [{action: Allow, protocol: TCP, destination: {ports: [http]}}]}\n", []string{`spec.ingress[0].destination.ports[0]: "http": use a port number or a range`}},
		{"reversed range", head + "spec: {ingress: [{action: Allow, protocol: TCP, destination: {notPorts: ['9:1']}}]}\n", []string{"spec.ingress[0].destination.notPorts[0]: range 9:1"}},
		{"unknown entity field", head + "spec: {ingress: [{action: Allow, source: {serviceAccounts: {}}}]}\n", []string{"spec.ingress[0].source.serviceAccounts: unknown field"}},
		{"list item bad", "apiVersion: projectcalico.org/v3\nkind: List\nitems:\n- " + strings.ReplaceAll(head, "\n", "\n  ") + "spec: {order: x}\n", []string{"items[0].spec.order: must be a number"}},
		{"list without items", "apiVersion: projectcalico.org/v3\nkind: List\n", []string{"items: is required"}},
		{"duplicate name", head + "---\n" + head, []string{`document 2: metadata.name: policy "p" is given twice`}},
		{"not yaml", "a: [\n", []string{"not valid YAML or JSON"}},
		{"second doc bad", head + "---\n" + head + "spec: {ingress: [{action: Nope}]}\n", []string{"document 2: spec.ingress[0].action"}},
		{"several errors", head + "spec: {order: x, ingress: [{action: Allow, protocol: TCP, destination: {ports: [0]}}, {action: Y}]}\n", []string{"spec.order:", "spec.ingress[0].destination.ports[0]:", "spec.ingress[1].action:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeString(t, tc.in)
			wantValidationError(t, err, tc.want)
		})
	}
}

// wantValidationError: err is a *ValidationError containing every want.
func wantValidationError(t *testing.T, err error, want []string) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v, want a *ValidationError", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestDecodeEmpty(t *testing.T) {
	if _, err := decodeString(t, "---\n"); !errors.Is(err, ErrNoResources) {
		t.Errorf("empty input: %v", err)
	}
}

func TestSortOrder(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	ps := []GlobalNetworkPolicy{
		{Metadata: Metadata{Name: "z-unset"}},
		{Metadata: Metadata{Name: "b"}, Spec: PolicySpec{Order: f(10)}},
		{Metadata: Metadata{Name: "a-unset"}},
		{Metadata: Metadata{Name: "c"}, Spec: PolicySpec{Order: f(1)}},
		{Metadata: Metadata{Name: "a"}, Spec: PolicySpec{Order: f(10)}},
	}
	Sort(ps)
	var got []string
	for _, p := range ps {
		got = append(got, p.Metadata.Name)
	}
	if want := []string{"c", "a", "b", "a-unset", "z-unset"}; !reflect.DeepEqual(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}
