package plugin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDockerNames: the policy's name lookup over the Engine API, against a
// fake dockerd answering network inspect like 20.10 (API 1.41).
func TestDockerNames(t *testing.T) {
	const id = "5140286622f2aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Api-Version", "1.41")
		w.Header().Set("Content-Type", "application/json")
		switch p := r.URL.Path; {
		case p == "/_ping":
			w.Write([]byte("OK"))
		case p == "/v1.41/networks/"+id:
			json.NewEncoder(w).Encode(map[string]any{"Id": id, "Name": "net1"})
		case p == "/v1.41/networks/5140": // Docker resolves id prefixes too
			json.NewEncoder(w).Encode(map[string]any{"Id": id, "Name": "net1"})
		case p == "/v1.41/networks/broken":
			w.WriteHeader(500)
			json.NewEncoder(w).Encode(map[string]string{"message": "boom"})
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(map[string]string{"message": "network not found"})
		}
	}))
	defer srv.Close()
	names, err := newDockerNames("tcp://" + strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer names.cli.Close()
	ctx := context.Background()
	tests := []struct {
		id        string
		wantName  string
		wantFound bool
		wantErr   bool
	}{
		{id, "net1", true, false},
		{"5140", "", false, false}, // a prefix match is another network's answer
		{"unknown", "", false, false},
		{"broken", "", false, true},
	}
	for _, tc := range tests {
		name, found, err := names.NetworkName(ctx, tc.id)
		if name != tc.wantName || found != tc.wantFound || (err != nil) != tc.wantErr {
			t.Errorf("NetworkName(%q) = %q, %v, %v; want %q, %v, error %v", tc.id, name, found, err, tc.wantName, tc.wantFound, tc.wantErr)
		}
	}
	if _, err := newDockerNames("ftp://x"); err == nil {
		t.Error("a docker host with an unknown scheme was accepted")
	}
}
