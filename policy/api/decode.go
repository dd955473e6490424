package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/calico-cnm/calico-cnm/policy/selector"
)

// FieldError is one problem with one field of a document.
type FieldError struct {
	Doc  int    // 1-based document number in the input
	Path string // e.g. spec.ingress[1].destination.ports[0]
	Msg  string
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("document %d: %s", e.Doc, e.Msg)
	}
	return fmt.Sprintf("document %d: %s: %s", e.Doc, e.Path, e.Msg)
}

// ValidationError lists every problem found; nothing of the input is
// applied when there is one.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.Error()
	}
	return "invalid resources: " + strings.Join(lines, "; ")
}

// ErrNoResources: the input held no document.
var ErrNoResources = errors.New("no resources in the input")

// Decode reads YAML (one or more documents, separated by ---) or JSON: each
// document a GlobalNetworkPolicy or a List (kind List or
// GlobalNetworkPolicyList) of them. Every policy is validated and
// defaulted; any problem anywhere fails the whole input with a
// *ValidationError naming each bad field. Input holding other kinds is
// refused: DecodeResources reads those.
func Decode(r io.Reader) ([]GlobalNetworkPolicy, error) {
	res, err := DecodeResources(r)
	if err != nil {
		return nil, err
	}
	if len(res.HostEndpoints)+len(res.NetworkSets) > 0 {
		return nil, fmt.Errorf("only %s resources are read here, not %s or %s", KindPolicy, KindHostEndpoint, KindNetworkSet)
	}
	return res.Policies, nil
}

// DecodeResources is Decode for every kind apply takes:
// GlobalNetworkPolicy, HostEndpoint and GlobalNetworkSet, alone or in
// Lists (kind List holds any of them), in any mix.
func DecodeResources(r io.Reader) (Resources, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Resources{}, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out Resources
	var errs []FieldError
	names := map[string]string{} // kind/name -> where it was given
	for doc := 1; ; doc++ {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, FieldError{Doc: doc, Msg: "not valid YAML or JSON: " + err.Error()})
			break
		}
		if v == nil {
			continue // an empty document (a trailing ---)
		}
		d := &decoder{doc: doc}
		var got Resources
		d.document(v, &got)
		where := fmt.Sprintf("document %d", doc)
		unique := func(kind, name string) bool {
			if prev, dup := names[kind+"/"+name]; dup {
				d.fail("metadata.name", fmt.Sprintf("%s %q is given twice (also in %s)", nouns[kind], name, prev))
				return false
			}
			names[kind+"/"+name] = where
			return true
		}
		for _, p := range got.Policies {
			if unique(KindPolicy, p.Metadata.Name) {
				out.Policies = append(out.Policies, p)
			}
		}
		for _, h := range got.HostEndpoints {
			if unique(KindHostEndpoint, h.Metadata.Name) {
				out.HostEndpoints = append(out.HostEndpoints, h)
			}
		}
		for _, n := range got.NetworkSets {
			if unique(KindNetworkSet, n.Metadata.Name) {
				out.NetworkSets = append(out.NetworkSets, n)
			}
		}
		errs = append(errs, d.errs...)
	}
	if len(errs) > 0 {
		return Resources{}, &ValidationError{Errors: errs}
	}
	if out.Len() == 0 {
		return Resources{}, ErrNoResources
	}
	return out, nil
}

// DecodeStored reads one policy record from the datastore and validates it
// again: a record written by something other than this CLI is checked too.
func DecodeStored(data []byte) (GlobalNetworkPolicy, error) {
	return decodeStored(data, (*decoder).policy)
}

// DecodeStoredHostEndpoint is DecodeStored for a host endpoint record.
func DecodeStoredHostEndpoint(data []byte) (HostEndpoint, error) {
	return decodeStored(data, (*decoder).hostEndpoint)
}

// DecodeStoredNetworkSet is DecodeStored for a network set record.
func DecodeStoredNetworkSet(data []byte) (GlobalNetworkSet, error) {
	return decodeStored(data, (*decoder).networkSet)
}

func decodeStored[T any](data []byte, decode func(d *decoder, path string, m map[string]any) T) (T, error) {
	var zero T
	var v any
	// Records are JSON: encoding/json reads them several times faster
	// than the YAML parser (a network set may hold thousands of networks);
	// YAML, a superset, reads what another writer may have stored.
	if json.Unmarshal(data, &v) != nil {
		if err := yaml.Unmarshal(data, &v); err != nil {
			return zero, fmt.Errorf("not valid JSON: %w", err)
		}
	}
	d := &decoder{doc: 1}
	m, ok := d.object("", v)
	if !ok {
		return zero, &ValidationError{Errors: d.errs}
	}
	r := decode(d, "", m)
	if len(d.errs) > 0 {
		return zero, &ValidationError{Errors: d.errs}
	}
	return r, nil
}

type decoder struct {
	doc  int
	errs []FieldError
}

func (d *decoder) fail(path, msg string) {
	d.errs = append(d.errs, FieldError{Doc: d.doc, Path: path, Msg: msg})
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// object checks v is a mapping with string keys.
func (d *decoder) object(path string, v any) (map[string]any, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(path, fmt.Sprintf("must be an object, not %s", describe(v)))
	}
	return m, ok
}

// fields refuses keys not in allowed.
func (d *decoder) fields(path string, m map[string]any, allowed ...string) {
	var unknown []string
	for k := range m {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		d.fail(join(path, k), fmt.Sprintf("unknown field (known fields: %s)", strings.Join(allowed, ", ")))
	}
}

func describe(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", t)
	case bool:
		return fmt.Sprintf("the boolean %v", t)
	case int, int64, uint64, float64:
		return fmt.Sprintf("the number %v", t)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func (d *decoder) str(path string, v any) (string, bool) {
	s, ok := v.(string)
	if !ok {
		d.fail(path, "must be a string, not "+describe(v))
	}
	return s, ok
}

func (d *decoder) list(path string, v any) []any {
	l, ok := v.([]any)
	if !ok {
		d.fail(path, "must be a list, not "+describe(v))
	}
	return l
}

// integer accepts whole numbers only.
func (d *decoder) integer(path string, v any) (int64, bool) {
	switch t := v.(type) {
	case int:
		return int64(t), true
	case int64:
		return t, true
	case uint64:
		if t <= math.MaxInt64 {
			return int64(t), true
		}
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1<<53 {
			return int64(t), true
		}
	}
	d.fail(path, "must be a whole number, not "+describe(v))
	return 0, false
}

func (d *decoder) number(path string, v any) (float64, bool) {
	switch t := v.(type) {
	case int:
		return float64(t), true
	case int64:
		return float64(t), true
	case uint64:
		return float64(t), true
	case float64:
		if !math.IsNaN(t) && !math.IsInf(t, 0) {
			return t, true
		}
	}
	d.fail(path, "must be a number, not "+describe(v))
	return 0, false
}

// nouns name the kinds in messages.
var nouns = map[string]string{KindPolicy: "policy", KindHostEndpoint: "host endpoint", KindNetworkSet: "network set"}

// listKinds are the list kinds and the one kind each holds ("": any).
var listKinds = map[string]string{KindList: "", KindPolicyList: KindPolicy, KindHostEndpointList: KindHostEndpoint, KindNetworkSetList: KindNetworkSet}

func (d *decoder) document(v any, out *Resources) {
	m, ok := d.object("", v)
	if !ok {
		return
	}
	kind, _ := m["kind"].(string)
	itemKind, isList := listKinds[kind]
	if !isList {
		d.resource("", m, "", out)
		return
	}
	d.fields("", m, "apiVersion", "kind", "items", "metadata")
	d.apiVersion("", m, kind != KindList)
	items, present := m["items"]
	if !present {
		d.fail("items", "is required in a "+kind)
		return
	}
	for i, it := range d.list("items", items) {
		p := index("items", i)
		if im, ok := d.object(p, it); ok {
			d.resource(p, im, itemKind, out)
		}
	}
}

// resource decodes one resource by its kind; want, when set, is the only
// kind allowed (the items of a typed list, which may leave kind out).
func (d *decoder) resource(path string, m map[string]any, want string, out *Resources) {
	kind, _ := m["kind"].(string)
	if kind == "" {
		kind = want
	}
	if want != "" && kind != want {
		d.fail(join(path, "kind"), fmt.Sprintf("%q in a %sList: use %s", kind, want, want))
		return
	}
	switch kind {
	case KindHostEndpoint:
		out.HostEndpoints = append(out.HostEndpoints, d.hostEndpoint(path, m))
	case KindNetworkSet:
		out.NetworkSets = append(out.NetworkSets, d.networkSet(path, m))
	default:
		out.Policies = append(out.Policies, d.policy(path, m))
	}
}

func (d *decoder) apiVersion(path string, m map[string]any, required bool) {
	v, present := m["apiVersion"]
	if !present {
		if required {
			d.fail(join(path, "apiVersion"), "is required: "+APIVersion)
		}
		return
	}
	if s, ok := d.str(join(path, "apiVersion"), v); ok && s != APIVersion {
		d.fail(join(path, "apiVersion"), fmt.Sprintf("%q is not supported: use %s", s, APIVersion))
	}
}

func (d *decoder) policy(path string, m map[string]any) GlobalNetworkPolicy {
	p := GlobalNetworkPolicy{APIVersion: APIVersion, Kind: KindPolicy}
	d.fields(path, m, "apiVersion", "kind", "metadata", "spec")
	d.apiVersion(path, m, true)
	if k, present := m["kind"]; !present {
		d.fail(join(path, "kind"), "is required: "+KindPolicy)
	} else if s, ok := d.str(join(path, "kind"), k); ok && s != KindPolicy {
		d.fail(join(path, "kind"), fmt.Sprintf("%q is not supported: use %s, %s or %s (or a List of them)", s, KindPolicy, KindHostEndpoint, KindNetworkSet))
	}
	if md, present := m["metadata"]; !present {
		d.fail(join(path, "metadata"), "is required (metadata.name names the policy)")
	} else if mm, ok := d.object(join(path, "metadata"), md); ok {
		p.Metadata = d.metadata(join(path, "metadata"), mm, false)
	}
	if sp, present := m["spec"]; present && sp != nil {
		if sm, ok := d.object(join(path, "spec"), sp); ok {
			p.Spec = d.spec(join(path, "spec"), sm)
		}
	}
	if len(p.Spec.Types) == 0 {
		p.Spec.Types = DefaultTypes(p.Spec)
	}
	return p
}

// nameRE: a DNS-1123 subdomain, as Calico's names.
var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// maxName is Kubernetes' and Calico's limit for resource names.
const maxName = 253

// ValidName checks a policy name.
func ValidName(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if len(s) > maxName || !nameRE.MatchString(s) {
		return fmt.Errorf("%q is not a valid name: use at most %d lower-case letters, digits, '-' and '.', starting and ending with a letter or digit", s, maxName)
	}
	return nil
}

func (d *decoder) metadata(path string, m map[string]any, labels bool) Metadata {
	var md Metadata
	if labels {
		d.fields(path, m, "name", "labels")
		if lv, present := m["labels"]; present && lv != nil {
			md.Labels = d.labels(join(path, "labels"), lv)
		}
	} else {
		d.fields(path, m, "name")
	}
	v, present := m["name"]
	if !present {
		d.fail(join(path, "name"), "is required")
		return md
	}
	if s, ok := d.str(join(path, "name"), v); ok {
		if err := ValidName(s); err != nil {
			d.fail(join(path, "name"), err.Error())
		}
		md.Name = s
	}
	return md
}

func (d *decoder) selectorField(path string, v any) string {
	s, ok := d.str(path, v)
	if !ok {
		return ""
	}
	if _, err := selector.Parse(s); err != nil {
		var se *selector.Error
		if errors.As(err, &se) {
			d.fail(path, fmt.Sprintf("invalid selector %q: at position %d: %s", s, se.Pos, se.Msg))
		} else {
			d.fail(path, err.Error())
		}
	}
	return s
}

func (d *decoder) spec(path string, m map[string]any) PolicySpec {
	var s PolicySpec
	d.fields(path, m, "order", "selector", "types", "ingress", "egress", "preDNAT", "applyOnForward")
	s.PreDNAT = d.boolean(join(path, "preDNAT"), m["preDNAT"])
	s.ApplyOnForward = d.boolean(join(path, "applyOnForward"), m["applyOnForward"])
	if v, present := m["order"]; present && v != nil {
		if f, ok := d.number(join(path, "order"), v); ok {
			s.Order = &f
		}
	}
	if v, present := m["selector"]; present {
		s.Selector = d.selectorField(join(path, "selector"), v)
	}
	if v, present := m["types"]; present && v != nil {
		tp := join(path, "types")
		for i, t := range d.list(tp, v) {
			ts, ok := d.str(index(tp, i), t)
			if !ok {
				continue
			}
			pt := PolicyType(ts)
			if pt != Ingress && pt != Egress {
				d.fail(index(tp, i), fmt.Sprintf("%q: use Ingress or Egress", ts))
				continue
			}
			if slices.Contains(typesStrings(s.Types), ts) {
				d.fail(index(tp, i), fmt.Sprintf("%q is given twice", ts))
				continue
			}
			s.Types = append(s.Types, pt)
		}
	}
	for _, dir := range []struct {
		field string
		rules *[]Rule
	}{{"ingress", &s.Ingress}, {"egress", &s.Egress}} {
		v, present := m[dir.field]
		if !present || v == nil {
			continue
		}
		rp := join(path, dir.field)
		for i, r := range d.list(rp, v) {
			if rm, ok := d.object(index(rp, i), r); ok {
				*dir.rules = append(*dir.rules, d.rule(index(rp, i), rm))
			}
		}
	}
	if _, given := m["types"]; given {
		if len(s.Ingress) > 0 && !slices.Contains(typesStrings(s.Types), string(Ingress)) {
			d.fail(join(path, "ingress"), "ingress rules are given but spec.types does not include Ingress")
		}
		if len(s.Egress) > 0 && !slices.Contains(typesStrings(s.Types), string(Egress)) {
			d.fail(join(path, "egress"), "egress rules are given but spec.types does not include Egress")
		}
	}
	d.preDNAT(path, s)
	return s
}

// preDNAT checks Calico's conditions on pre-DNAT policy: it is evaluated
// on traffic arriving at the host, before DNAT, for every destination
// (so it needs applyOnForward), and conntrack lets the replies of what it
// allows back, so it has no egress.
func (d *decoder) preDNAT(path string, s PolicySpec) {
	if !s.PreDNAT {
		return
	}
	if !s.ApplyOnForward {
		d.fail(join(path, "applyOnForward"), "must be true when preDNAT is true (pre-DNAT policy applies to forwarded traffic too)")
	}
	if len(s.Egress) > 0 {
		d.fail(join(path, "egress"), "pre-DNAT policy has ingress rules only")
	}
	if slices.Contains(s.Types, Egress) {
		d.fail(join(path, "types"), "pre-DNAT policy has type Ingress only")
	}
}

// boolean reads an optional true/false (absent or null: false).
func (d *decoder) boolean(path string, v any) bool {
	if v == nil {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		d.fail(path, "must be true or false, not "+describe(v))
	}
	return b
}

// labelKeyRE and labelValueRE are Kubernetes' (and Calico's) label syntax:
// an optional DNS prefix and "/", then a name; values may be empty.
var (
	labelKeyRE   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

func (d *decoder) labels(path string, v any) map[string]string {
	m, ok := d.object(path, v)
	if !ok {
		return nil
	}
	out := make(map[string]string, len(m))
	for _, k := range sortedMapKeys(m) {
		val, ok := d.str(join(path, k), m[k])
		if !ok {
			continue
		}
		if !labelKeyRE.MatchString(k) {
			d.fail(join(path, k), fmt.Sprintf("%q is not a valid label key", k))
			continue
		}
		if !labelValueRE.MatchString(val) {
			d.fail(join(path, k), fmt.Sprintf("%q is not a valid label value (at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)", val))
			continue
		}
		out[k] = val
	}
	return out
}

func sortedMapKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// header checks apiVersion, kind and metadata, common to every resource,
// and returns the metadata.
func (d *decoder) header(path string, m map[string]any, kind string, labels bool) Metadata {
	d.apiVersion(path, m, true)
	if k, present := m["kind"]; !present {
		d.fail(join(path, "kind"), "is required: "+kind)
	} else if s, ok := d.str(join(path, "kind"), k); ok && s != kind {
		d.fail(join(path, "kind"), fmt.Sprintf("%q: this record is a %s", s, kind))
	}
	md, present := m["metadata"]
	if !present {
		d.fail(join(path, "metadata"), "is required (metadata.name names the resource)")
		return Metadata{}
	}
	mm, ok := d.object(join(path, "metadata"), md)
	if !ok {
		return Metadata{}
	}
	return d.metadata(join(path, "metadata"), mm, labels)
}

// spec is the resource's spec object (nil when absent).
func (d *decoder) specObject(path string, m map[string]any, fields ...string) map[string]any {
	sp, present := m["spec"]
	if !present || sp == nil {
		return nil
	}
	sm, ok := d.object(join(path, "spec"), sp)
	if !ok {
		return nil
	}
	d.fields(join(path, "spec"), sm, fields...)
	return sm
}

func (d *decoder) hostEndpoint(path string, m map[string]any) HostEndpoint {
	h := HostEndpoint{APIVersion: APIVersion, Kind: KindHostEndpoint}
	d.fields(path, m, "apiVersion", "kind", "metadata", "spec")
	h.Metadata = d.header(path, m, KindHostEndpoint, true)
	sp := join(path, "spec")
	sm := d.specObject(path, m, "node", "interfaceName", "expectedIPs")
	if v, present := sm["node"]; !present {
		d.fail(join(sp, "node"), "is required: the node name of the host the interface is on")
	} else if s, ok := d.str(join(sp, "node"), v); ok {
		if s == "" {
			d.fail(join(sp, "node"), "must not be empty")
		}
		h.Spec.Node = s
	}
	if v, present := sm["interfaceName"]; present && v != nil {
		if s, ok := d.str(join(sp, "interfaceName"), v); ok {
			if s != AllInterfaces && (s == "" || len(s) > 15 || strings.ContainsAny(s, "/ \t\n*")) {
				d.fail(join(sp, "interfaceName"), fmt.Sprintf("%q: give an interface name (1 to 15 characters) or \"*\" for all the host's interfaces", s))
			}
			h.Spec.InterfaceName = s
		}
	}
	if v, present := sm["expectedIPs"]; present && v != nil {
		ep := join(sp, "expectedIPs")
		for i, a := range d.list(ep, v) {
			s, ok := d.str(index(ep, i), a)
			if !ok {
				continue
			}
			addr, err := netip.ParseAddr(s)
			if err != nil || addr.Zone() != "" {
				d.fail(index(ep, i), fmt.Sprintf("%q is not an IP address", s))
				continue
			}
			h.Spec.ExpectedIPs = append(h.Spec.ExpectedIPs, addr.Unmap().String())
		}
	}
	if h.Spec.InterfaceName == "" && len(h.Spec.ExpectedIPs) == 0 && sm != nil {
		d.fail(sp, "give interfaceName, expectedIPs or both")
	}
	return h
}

func (d *decoder) networkSet(path string, m map[string]any) GlobalNetworkSet {
	n := GlobalNetworkSet{APIVersion: APIVersion, Kind: KindNetworkSet}
	d.fields(path, m, "apiVersion", "kind", "metadata", "spec")
	n.Metadata = d.header(path, m, KindNetworkSet, true)
	sm := d.specObject(path, m, "nets")
	if v, present := sm["nets"]; present && v != nil {
		np := join(join(path, "spec"), "nets")
		for i, e := range d.list(np, v) {
			s, ok := d.str(index(np, i), e)
			if !ok {
				continue
			}
			pfx, err := ParseNet(s)
			if err != nil {
				d.fail(index(np, i), err.Error())
				continue
			}
			n.Spec.Nets = append(n.Spec.Nets, pfx.String())
		}
	}
	return n
}

func typesStrings(ts []PolicyType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

func (d *decoder) rule(path string, m map[string]any) Rule {
	var r Rule
	d.fields(path, m, "action", "ipVersion", "protocol", "notProtocol", "icmp", "source", "destination")
	if v, present := m["action"]; !present {
		d.fail(join(path, "action"), "is required: Allow, Deny, Log or Pass")
	} else if s, ok := d.str(join(path, "action"), v); ok {
		switch a := Action(s); a {
		case Allow, Deny, Log, Pass:
			r.Action = a
		default:
			d.fail(join(path, "action"), fmt.Sprintf("%q: use Allow, Deny, Log or Pass", s))
		}
	}
	if v, present := m["ipVersion"]; present && v != nil {
		if n, ok := d.integer(join(path, "ipVersion"), v); ok {
			if n != 4 && n != 6 {
				d.fail(join(path, "ipVersion"), fmt.Sprintf("%d: use 4 or 6", n))
			} else {
				iv := int(n)
				r.IPVersion = &iv
			}
		}
	}
	if v, present := m["protocol"]; present && v != nil {
		r.Protocol = d.protocol(join(path, "protocol"), v)
	}
	if v, present := m["notProtocol"]; present && v != nil {
		r.NotProtocol = d.protocol(join(path, "notProtocol"), v)
	}
	if v, present := m["icmp"]; present && v != nil {
		r.ICMP = d.icmp(join(path, "icmp"), v, r)
	}
	for _, e := range []struct {
		field string
		to    *EntityRule
	}{{"source", &r.Source}, {"destination", &r.Destination}} {
		v, present := m[e.field]
		if !present || v == nil {
			continue
		}
		if em, ok := d.object(join(path, e.field), v); ok {
			*e.to = d.entity(join(path, e.field), em, r)
		}
	}
	return r
}

func (d *decoder) protocol(path string, v any) *Protocol {
	if s, ok := v.(string); ok {
		if p, ok := ProtocolFromName(s); ok {
			return &p
		}
		if n, err := strconv.Atoi(s); err == nil && n >= 1 && n <= 255 {
			p := ProtocolFromNumber(uint8(n))
			return &p
		}
		d.fail(path, fmt.Sprintf("%q: use TCP, UDP, ICMP, ICMPv6, SCTP, UDPLite or a number 1-255", s))
		return nil
	}
	n, ok := d.integer(path, v)
	if !ok {
		return nil
	}
	if n < 1 || n > 255 {
		d.fail(path, fmt.Sprintf("%d: protocol numbers are 1-255", n))
		return nil
	}
	p := ProtocolFromNumber(uint8(n))
	return &p
}

func (d *decoder) icmp(path string, v any, r Rule) *ICMPFields {
	m, ok := d.object(path, v)
	if !ok {
		return nil
	}
	d.fields(path, m, "type", "code")
	if r.Protocol == nil || (r.Protocol.Num != 1 && r.Protocol.Num != 58) {
		d.fail(path, "needs protocol ICMP or ICMPv6")
	}
	var f ICMPFields
	field := func(name string, max int64) *int {
		v, present := m[name]
		if !present || v == nil {
			return nil
		}
		n, ok := d.integer(join(path, name), v)
		if !ok {
			return nil
		}
		if n < 0 || n > max {
			d.fail(join(path, name), fmt.Sprintf("%d: use 0-%d", n, max))
			return nil
		}
		i := int(n)
		return &i
	}
	// Type 255 is reserved (Calico refuses it too).
	f.Type = field("type", 254)
	f.Code = field("code", 255)
	if _, hasCode := m["code"]; hasCode {
		if _, hasType := m["type"]; !hasType {
			d.fail(join(path, "code"), "needs icmp.type")
		}
	}
	return &f
}

func (d *decoder) entity(path string, m map[string]any, r Rule) EntityRule {
	var e EntityRule
	d.fields(path, m, "nets", "notNets", "selector", "notSelector", "ports", "notPorts")
	nets := func(field string) []string {
		v, present := m[field]
		if !present || v == nil {
			return nil
		}
		var out []string
		for i, n := range d.list(join(path, field), v) {
			p := index(join(path, field), i)
			s, ok := d.str(p, n)
			if !ok {
				continue
			}
			pfx, err := ParseNet(s)
			if err != nil {
				d.fail(p, err.Error())
				continue
			}
			if r.IPVersion != nil && (*r.IPVersion == 4) != pfx.Addr().Is4() {
				d.fail(p, fmt.Sprintf("%s is not an IPv%d network (the rule's ipVersion)", s, *r.IPVersion))
			}
			out = append(out, pfx.String())
		}
		return out
	}
	e.Nets = nets("nets")
	e.NotNets = nets("notNets")
	if v, present := m["selector"]; present {
		e.Selector = d.selectorField(join(path, "selector"), v)
	}
	if v, present := m["notSelector"]; present {
		e.NotSelector = d.selectorField(join(path, "notSelector"), v)
	}
	ports := func(field string) []Port {
		v, present := m[field]
		if !present || v == nil {
			return nil
		}
		if r.Protocol == nil || !r.Protocol.HasPorts() {
			d.fail(join(path, field), "needs protocol TCP, UDP, SCTP or UDPLite")
		}
		var out []Port
		for i, pv := range d.list(join(path, field), v) {
			if p, ok := d.port(index(join(path, field), i), pv); ok {
				out = append(out, p)
			}
		}
		return out
	}
	e.Ports = ports("ports")
	e.NotPorts = ports("notPorts")
	return e
}

// ParseNet accepts a CIDR or a single address, and returns it masked.
func ParseNet(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (e.g. 10.0.0.0/8) or an address", s)
}

func (d *decoder) port(path string, v any) (Port, bool) {
	if s, ok := v.(string); ok {
		lo, hi, isRange := strings.Cut(s, ":")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil {
			d.fail(path, fmt.Sprintf("%q: use a port number or a range \"first:last\" (named ports are not supported)", s))
			return Port{}, false
		}
		return d.portRange(path, int64(a), int64(b))
	}
	n, ok := d.integer(path, v)
	if !ok {
		return Port{}, false
	}
	return d.portRange(path, n, n)
}

func (d *decoder) portRange(path string, a, b int64) (Port, bool) {
	for _, n := range []int64{a, b} {
		if n < 1 || n > 65535 {
			d.fail(path, fmt.Sprintf("%d is not a port: ports are 1-65535", n))
			return Port{}, false
		}
	}
	if a > b {
		d.fail(path, fmt.Sprintf("range %d:%d: the first port is above the last", a, b))
		return Port{}, false
	}
	return Port{Min: uint16(a), Max: uint16(b)}, true
}
