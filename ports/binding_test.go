package ports

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
)

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    map[string]interface{}
		want    []Request
		wantErr string
	}{
		{name: "none", opts: map[string]interface{}{}, want: nil},
		{name: "tcp, udp, host address, range, ephemeral",
			opts: map[string]interface{}{OptPortMap: []interface{}{
				map[string]interface{}{"Proto": 6, "IP": "", "Port": 8080, "HostIP": "", "HostPort": 18080, "HostPortEnd": 18080},
				map[string]interface{}{"Proto": 17, "Port": 53, "HostIP": "127.0.0.1", "HostPort": 5353},
				map[string]interface{}{"Proto": 6, "Port": 80, "HostPort": 8000, "HostPortEnd": 8010},
				map[string]interface{}{"Proto": 6, "Port": 81, "HostIP": "::", "HostPort": 0},
			}},
			want: []Request{
				{Proto: TCP, HostPort: 18080, HostPortEnd: 18080, Port: 8080},
				{Proto: UDP, HostIP: "127.0.0.1", HostPort: 5353, HostPortEnd: 5353, Port: 53},
				{Proto: TCP, HostPort: 8000, HostPortEnd: 8010, Port: 80},
				{Proto: TCP, HostIP: "::", Port: 81},
			}},
		{name: "sctp", opts: map[string]interface{}{OptPortMap: []interface{}{map[string]interface{}{"Proto": 132, "Port": 1, "HostPort": 1}}}, wantErr: "SCTP"},
		{name: "bad host address", opts: map[string]interface{}{OptPortMap: []interface{}{map[string]interface{}{"Proto": 6, "Port": 1, "HostIP": "x"}}}, wantErr: "host address"},
		{name: "not a list", opts: map[string]interface{}{OptPortMap: "8080"}, wantErr: "not a list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseOptions(tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("error = %v, want ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseOptions = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	taken := []datastore.PortBinding{
		{Proto: TCP, HostPort: 18080, Port: 80},
		{Proto: UDP, HostIP: "10.0.0.1", HostPort: 5353, Port: 53},
		{Proto: TCP, HostPort: EphemeralFirst, Port: 80},
	}
	owner := func(i int) string { return []string{"c1", "c2", "c3"}[i] }
	tests := []struct {
		name    string
		reqs    []Request
		want    []datastore.PortBinding
		wantErr string
	}{
		{name: "free port", reqs: []Request{{Proto: TCP, HostPort: 18081, HostPortEnd: 18081, Port: 80}},
			want: []datastore.PortBinding{{Proto: TCP, HostPort: 18081, Port: 80}}},
		{name: "same port other protocol", reqs: []Request{{Proto: UDP, HostPort: 18080, HostPortEnd: 18080, Port: 80}},
			want: []datastore.PortBinding{{Proto: UDP, HostPort: 18080, Port: 80}}},
		{name: "taken on every address", reqs: []Request{{Proto: TCP, HostIP: "10.0.0.9", HostPort: 18080, HostPortEnd: 18080, Port: 80}}, wantErr: "published by c1"},
		{name: "taken on one address: another address is free", reqs: []Request{{Proto: UDP, HostIP: "10.0.0.2", HostPort: 5353, HostPortEnd: 5353, Port: 53}},
			want: []datastore.PortBinding{{Proto: UDP, HostIP: "10.0.0.2", HostPort: 5353, Port: 53}}},
		{name: "taken on one address: all addresses are not", reqs: []Request{{Proto: UDP, HostPort: 5353, HostPortEnd: 5353, Port: 53}}, wantErr: "published by c2"},
		{name: "IPv6 unspecified does not cover IPv4", reqs: []Request{{Proto: UDP, HostIP: "::", HostPort: 5353, HostPortEnd: 5353, Port: 53}},
			want: []datastore.PortBinding{{Proto: UDP, HostIP: "::", HostPort: 5353, Port: 53}}},
		{name: "range skips the taken port", reqs: []Request{{Proto: TCP, HostPort: 18080, HostPortEnd: 18082, Port: 80}},
			want: []datastore.PortBinding{{Proto: TCP, HostPort: 18081, Port: 80}}},
		{name: "ephemeral skips the taken port", reqs: []Request{{Proto: TCP, Port: 80}, {Proto: TCP, Port: 81}},
			want: []datastore.PortBinding{{Proto: TCP, HostPort: EphemeralFirst + 1, Port: 80}, {Proto: TCP, HostPort: EphemeralFirst + 2, Port: 81}}},
		{name: "twice in one request", reqs: []Request{{Proto: TCP, HostPort: 9000, HostPortEnd: 9000, Port: 80}, {Proto: TCP, HostPort: 9000, HostPortEnd: 9000, Port: 81}}, wantErr: "another binding of the same container"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.reqs, taken, owner)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrPortInUse) {
					t.Fatalf("error = %v, want ErrPortInUse containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
