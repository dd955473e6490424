package bandwidth

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		err  string
	}{
		{in: "50mbit", want: 50e6},
		{in: "50Mbit", want: 50e6},
		{in: "1.5gbit", want: 1.5e9},
		{in: "100gbit", want: 100e9},
		{in: "1kbit", want: 1000},
		{in: "1000", want: 1000},
		{in: "10mbps", want: 80e6},
		{in: "1mibit", want: 1 << 20},
		{in: "50 mbits", err: "unknown rate unit"},
		{in: "50mbits", err: "unknown rate unit"},
		{in: "-1", err: "does not start with a number"},
		{in: "", err: "does not start with a number"},
		{in: "999bit", err: "outside 1kbit..100gbit"},
		{in: "0", err: "outside"},
		{in: "101gbit", err: "outside"},
		{in: "1e9", err: "unknown rate unit"},
		{in: "1..2mbit", err: "is not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRate(tt.in)
			if tt.err != "" {
				if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseRate(%q) = %d, %v; want an error with %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseRate(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		err  string
	}{
		{in: "64k", want: 64 << 10},
		{in: "64kb", want: 64 << 10},
		{in: "1m", want: 1 << 20},
		{in: "1g", want: 1 << 30},
		{in: "20000", want: 20000},
		{in: "20000b", want: 20000},
		{in: "256kbit", want: 32 << 10},
		{in: "1k", err: "outside"},
		{in: "2g", err: "outside"},
		{in: "64 k", err: "unknown burst unit"},
		{in: "-64k", err: "does not start with a number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.err != "" {
				if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseSize(%q) = %d, %v; want an error with %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name                string
		driver, labels, net map[string]string
		want                Limits
		err                 string
	}{
		{name: "nothing"},
		{name: "network defaults", net: map[string]string{"calico.bandwidth.ingress": "10mbit", "calico.bandwidth.egress-burst": "1m"},
			want: Limits{IngressRate: 10e6, EgressBurst: 1 << 20}},
		{name: "label over network", labels: map[string]string{"projectcalico.org/bandwidth-ingress": "5mbit"},
			net: map[string]string{"calico.bandwidth.ingress": "10mbit", "calico.bandwidth.egress": "1mbit"}, want: Limits{IngressRate: 5e6, EgressRate: 1e6}},
		{name: "driver option over label", driver: map[string]string{"org.projectcalico.bandwidth.ingress": "7mbit"},
			labels: map[string]string{"projectcalico.org/bandwidth-ingress": "5mbit"}, want: Limits{IngressRate: 7e6}},
		{name: "bad label named as the Docker label", labels: map[string]string{"projectcalico.org/bandwidth-egress": "fast"},
			err: `bandwidth label org.projectcalico.bandwidth.egress="fast"`},
		{name: "bad network option", net: map[string]string{"calico.bandwidth.egress": "-1"},
			err: `network option calico.bandwidth.egress="-1"`},
		{name: "burst too long for the rate", driver: map[string]string{"org.projectcalico.bandwidth.egress": "1mbit", "org.projectcalico.bandwidth.egress-burst": "1g"},
			err: `endpoint driver option org.projectcalico.bandwidth.egress-burst 1g lasts 8590s at rate 1mbit`},
		{name: "burst of a label too long for the network's rate", labels: map[string]string{"projectcalico.org/bandwidth-ingress-burst": "512m"},
			net: map[string]string{"calico.bandwidth.ingress": "10mbit"}, err: `ingress-burst (of labels, driver options and network defaults) 512m lasts 429s at rate 10mbit`},
		{name: "longest burst at the lowest rate that tbf holds", driver: map[string]string{"org.projectcalico.bandwidth.egress": "1kbit", "org.projectcalico.bandwidth.egress-burst": "30000"},
			want: Limits{EgressRate: 1000, EgressBurst: 30000}},
		{name: "bad driver option", driver: map[string]string{"org.projectcalico.bandwidth.ingress-burst": "1"},
			err: `endpoint driver option org.projectcalico.bandwidth.ingress-burst="1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(tt.driver, tt.labels, tt.net)
			if tt.err != "" {
				if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Resolve = %+v, %v; want an error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestBurstAndFormat(t *testing.T) {
	tests := []struct {
		rate, explicit, want uint64
	}{
		{rate: 10e6, want: MinBurst}, // 12.5 kB at 10 ms: the minimum
		{rate: 1e9, want: 1_250_000}, // 10 ms at the rate
		{rate: 1e9, explicit: 64 << 10, want: 64 << 10},
	}
	for _, tt := range tests {
		if got := Burst(tt.rate, tt.explicit); got != tt.want {
			t.Errorf("Burst(%d, %d) = %d, want %d", tt.rate, tt.explicit, got, tt.want)
		}
	}
	l := Limits{IngressRate: 50e6, EgressRate: 1500, EgressBurst: 64 << 10}
	if got, want := l.String(), "ingress 50mbit, egress 1500bit burst 64k"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got := (Limits{}).String(); got != "-" {
		t.Errorf("String of no limits = %q", got)
	}
}
