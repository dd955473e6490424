// Package bandwidth shapes the traffic of each workload endpoint, the way
// the CNI bandwidth plugin does for Kubernetes pods: traffic into the
// container is held to its ingress rate by a token bucket (tbf) on the host
// side of its veth; traffic out of the container is redirected (u32
// match-all filter, mirred action) from the ingress qdisc of that veth to a
// per-endpoint ifb device, whose tbf holds it to the egress rate. Everything
// goes through netlink (Netlink, *netlink.Handle in production).
//
// A container asks for limits with labels or endpoint driver options named
// LabelPrefix+key, a network carries defaults as options
// NetworkOptionPrefix+key, for the keys Ingress, Egress, IngressBurst and
// EgressBurst; the container's own value wins over the network's.
package bandwidth

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Setting keys, each a suffix of a container label / endpoint driver
// option (LabelPrefix), of a network option (NetworkOptionPrefix) and of
// the endpoint label that carries the container label (EndpointLabelPrefix).
const (
	Ingress      = "ingress"
	Egress       = "egress"
	IngressBurst = "ingress-burst"
	EgressBurst  = "egress-burst"
)

// Keys are the setting keys in the order messages list them.
var Keys = []string{Ingress, IngressBurst, Egress, EgressBurst}

const (
	// LabelPrefix starts the container labels (docker run --label) and
	// endpoint driver options (docker network connect --driver-opt) that
	// set an endpoint's own limits, e.g.
	// org.projectcalico.bandwidth.ingress=50mbit; named like Calico's
	// org.projectcalico.label. labels.
	LabelPrefix = "org.projectcalico.bandwidth."
	// NetworkOptionPrefix starts the network options (docker network
	// create -o calico.bandwidth.ingress=...) that set the defaults of
	// the network's endpoints, like the project's other calico.* options.
	NetworkOptionPrefix = "calico.bandwidth."
	// EndpointLabelPrefix starts the endpoint labels the container labels
	// become (see EndpointLabels): the endpoint record keeps them with the
	// policy labels, so a restarted daemon and a later label lookup find
	// them there, and selectors may match them.
	EndpointLabelPrefix = "projectcalico.org/bandwidth-"
)

// Bounds of a rate, in bit/s, and of an explicit burst, in bytes.
const (
	MinRate = 1_000           // 1kbit
	MaxRate = 100_000_000_000 // 100gbit
	// MinBurst is the smallest bucket accepted and the smallest default:
	// a packet larger than the bucket never passes tbf, and 16 KiB holds
	// the largest jumbo frame (9 KiB) with room to spare.
	MinBurst = 16 << 10
	// MaxBurst: tbf keeps the bucket as a 32-bit number of clock ticks.
	MaxBurst = 1 << 30
)

// MaxBucketTime bounds how long a bucket lasts at its rate: tbf holds it
// as a 32-bit count of 64 ns clock ticks (about 275 s); a larger one
// wraps around to a small, wrong bucket.
const MaxBucketTime = 4 * time.Minute

// ErrBadValue is wrapped by every error about a malformed or out-of-range
// setting.
var ErrBadValue = errors.New("invalid bandwidth setting")

// Limits are one endpoint's limits: rates in bit/s (0: unlimited) and
// bursts in bytes (0: the default for the rate, see Burst).
type Limits struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// None tells whether l limits nothing.
func (l Limits) None() bool { return l.IngressRate == 0 && l.EgressRate == 0 }

// or fills l's unset fields from d: the container's own values win.
func (l Limits) or(d Limits) Limits {
	pick := func(a, b uint64) uint64 {
		if a != 0 {
			return a
		}
		return b
	}
	return Limits{
		IngressRate:  pick(l.IngressRate, d.IngressRate),
		IngressBurst: pick(l.IngressBurst, d.IngressBurst),
		EgressRate:   pick(l.EgressRate, d.EgressRate),
		EgressBurst:  pick(l.EgressBurst, d.EgressBurst),
	}
}

// direction is one direction's rate and burst with their setting keys.
type direction struct {
	key, burstKey string
	rate, burst   uint64
}

func (l Limits) directions() [2]direction {
	return [2]direction{{Ingress, IngressBurst, l.IngressRate, l.IngressBurst}, {Egress, EgressBurst, l.EgressRate, l.EgressBurst}}
}

// String is tc-like: "ingress 50mbit burst 62500b, egress 10mbit" or "-".
func (l Limits) String() string {
	var parts []string
	for _, d := range l.directions() {
		if d.rate == 0 {
			continue
		}
		s := d.key + " " + FormatRate(d.rate)
		if d.burst != 0 {
			s += " burst " + FormatSize(d.burst)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// check refuses a bucket the kernel cannot hold: a burst that lasts over
// MaxBucketTime at its rate. name words a burst key for the user.
func (l Limits) check(name func(key string) string) error {
	for _, d := range l.directions() {
		if d.rate == 0 {
			continue
		}
		b := Burst(d.rate, d.burst)
		if lasts := float64(b) * 8 / float64(d.rate); lasts > MaxBucketTime.Seconds() {
			return fmt.Errorf("%w: %s %s lasts %.0fs at rate %s, over %s: lower the burst or raise the rate",
				ErrBadValue, name(d.burstKey), FormatSize(b), lasts, FormatRate(d.rate), MaxBucketTime)
		}
	}
	return nil
}

// burstLatency is how long the default bucket lasts at the rate: long
// enough that the timer granularity of a busy host does not cost rate.
const burstLatency = 0.010 // seconds

// Burst is the bucket for rate (bit/s): explicit when set, else the rate
// for burstLatency, at least MinBurst.
func Burst(rate, explicit uint64) uint64 {
	if explicit != 0 {
		return explicit
	}
	return max(uint64(float64(rate)/8*burstLatency), MinBurst)
}

// Units of tc(8): a rate without a unit is in bit/s, a size in bytes;
// matched case-insensitively.
var rateUnits = map[string]float64{
	"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
	"kibit": 1 << 10, "mibit": 1 << 20, "gibit": 1 << 30, "tibit": 1 << 40,
	"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
	"kibps": 8 << 10, "mibps": 8 << 20, "gibps": 8 << 30, "tibps": 8 << 40,
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
	"kbit": 1 << 10 / 8, "mbit": 1 << 20 / 8, "gbit": 1 << 30 / 8,
}

// splitNumber splits "50mbit" into 50 and "mbit"; the number must be a
// plain non-negative decimal (no sign, no space, no exponent).
func splitNumber(s string) (float64, string, error) {
	i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) && r != '.' })
	if i < 0 {
		i = len(s)
	}
	if i == 0 {
		return 0, "", errors.New("does not start with a number")
	}
	v, err := strconv.ParseFloat(s[:i], 64)
	if err != nil {
		return 0, "", fmt.Errorf("%q is not a number", s[:i])
	}
	return v, strings.ToLower(s[i:]), nil
}

func unitList(units map[string]float64) string {
	var out []string
	for u := range units {
		if u != "" {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// quantity is how ParseRate and ParseSize read their kind of value.
type quantity struct {
	what, example string
	units         map[string]float64
	lo, hi        float64
	bounds        string
}

var (
	rateQuantity = quantity{what: "rate", example: "50mbit", units: rateUnits, lo: MinRate, hi: MaxRate, bounds: "1kbit..100gbit"}
	sizeQuantity = quantity{what: "burst", example: "64k", units: sizeUnits, lo: MinBurst, hi: MaxBurst,
		bounds: FormatSize(MinBurst) + ".." + FormatSize(MaxBurst)}
)

func (q quantity) parse(s string) (uint64, error) {
	v, unit, err := splitNumber(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v (write a %s like %s)", ErrBadValue, err, q.what, q.example)
	}
	mult, ok := q.units[unit]
	if !ok {
		return 0, fmt.Errorf("%w: unknown %s unit %q (units: %s)", ErrBadValue, q.what, unit, unitList(q.units))
	}
	x := v * mult
	if x < q.lo || x > q.hi || math.IsNaN(x) {
		return 0, fmt.Errorf("%w: %s %s is outside %s", ErrBadValue, q.what, s, q.bounds)
	}
	return uint64(math.Round(x)), nil
}

// ParseRate reads a rate as tc does ("50mbit", "1gbit", "500kbps") into
// bit/s, within MinRate..MaxRate.
func ParseRate(s string) (uint64, error) { return rateQuantity.parse(s) }

// ParseSize reads a size as tc does ("64k", "1m", "32kbit", "20000")
// into bytes, within MinBurst..MaxBurst.
func ParseSize(s string) (uint64, error) { return sizeQuantity.parse(s) }

// FormatRate writes bit/s the way tc prints rates.
func FormatRate(bits uint64) string {
	for _, u := range []struct {
		name string
		v    uint64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if bits >= u.v && bits%u.v == 0 {
			return strconv.FormatUint(bits/u.v, 10) + u.name
		}
	}
	return strconv.FormatUint(bits, 10) + "bit"
}

// FormatSize writes bytes the way tc reads sizes.
func FormatSize(b uint64) string {
	for _, u := range []struct {
		name string
		v    uint64
	}{{"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if b >= u.v && b%u.v == 0 {
			return strconv.FormatUint(b/u.v, 10) + u.name
		}
	}
	return strconv.FormatUint(b, 10) + "b"
}

// parseSettings reads the settings of settings whose names are
// prefix+key; name words a key for the user (the label or option they
// wrote).
func parseSettings(settings map[string]string, prefix string, name func(key string) string) (Limits, error) {
	var l Limits
	for _, key := range Keys {
		v, ok := settings[prefix+key]
		if !ok {
			continue
		}
		var err error
		switch key {
		case Ingress:
			l.IngressRate, err = ParseRate(v)
		case Egress:
			l.EgressRate, err = ParseRate(v)
		case IngressBurst:
			l.IngressBurst, err = ParseSize(v)
		case EgressBurst:
			l.EgressBurst, err = ParseSize(v)
		}
		if err != nil {
			return Limits{}, fmt.Errorf("%s=%q: %w", name(key), v, err)
		}
	}
	return l, l.check(name)
}

func labelName(key string) string { return "bandwidth label " + LabelPrefix + key }

func driverOptName(key string) string { return "endpoint driver option " + LabelPrefix + key }

func networkOptName(key string) string { return "network option " + NetworkOptionPrefix + key }

// ParseNetworkOptions reads a network's defaults from its options.
func ParseNetworkOptions(opts map[string]string) (Limits, error) {
	return parseSettings(opts, NetworkOptionPrefix, networkOptName)
}

// ParseDriverOptions reads an endpoint's own limits from its driver
// options.
func ParseDriverOptions(opts map[string]string) (Limits, error) {
	return parseSettings(opts, LabelPrefix, driverOptName)
}

// DriverOptions are the bandwidth settings among an endpoint's driver
// options (nil: none), for its record.
func DriverOptions(opts map[string]string) map[string]string {
	var out map[string]string
	for _, key := range Keys {
		if v, ok := opts[LabelPrefix+key]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[LabelPrefix+key] = v
		}
	}
	return out
}

// EndpointLabels maps the container's bandwidth labels to the endpoint
// labels that carry them (package policy adds them to the endpoint's).
func EndpointLabels(dockerLabels map[string]string) map[string]string {
	out := map[string]string{}
	for _, key := range Keys {
		if v, ok := dockerLabels[LabelPrefix+key]; ok {
			out[EndpointLabelPrefix+key] = v
		}
	}
	return out
}

// Resolve is an endpoint's limits: its driver options over its labels
// (the endpoint labels EndpointLabels made) over its network's options.
// The error names the label or option that is wrong.
func Resolve(driverOpts, endpointLabels, networkOpts map[string]string) (Limits, error) {
	own, err := ParseDriverOptions(driverOpts)
	if err != nil {
		return Limits{}, err
	}
	labelled, err := parseSettings(endpointLabels, EndpointLabelPrefix, labelName)
	if err != nil {
		return Limits{}, err
	}
	defaults, err := ParseNetworkOptions(networkOpts)
	if err != nil {
		return Limits{}, err
	}
	l := own.or(labelled).or(defaults)
	// Each source was checked alone; a burst from one and a rate from
	// another meet only here.
	if err := l.check(func(key string) string { return key + " (of labels, driver options and network defaults)" }); err != nil {
		return Limits{}, err
	}
	return l, nil
}
