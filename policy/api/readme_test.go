package api

import (
	"os"
	"strings"
	"testing"
)

// The README's policy file is the tested one (the e2e test applies it),
// byte for byte, and it decodes.
func TestREADMEPolicyFile(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	begin := strings.Index(s, "<!-- policy-file:begin -->\n```yaml\n")
	end := strings.Index(s, "```\n<!-- policy-file:end -->")
	if begin < 0 || end < begin {
		t.Fatal("README.md has no policy-file block")
	}
	block := s[begin+len("<!-- policy-file:begin -->\n```yaml\n") : end]
	want, err := os.ReadFile("testdata/three-tier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if block != string(want) {
		t.Errorf("README's policy differs from testdata/three-tier.yaml:\n%s", block)
	}
	if _, err := Decode(strings.NewReader(block)); err != nil {
		t.Errorf("README's policy does not apply: %v", err)
	}
}

// The README's host endpoint and network set files decode, every kind in
// one input (the e2e tests apply them).
func TestREADMEResourceFiles(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		block                  string
		policies, heps, gnsets int
	}{
		{"host-policy-file", 2, 1, 1},
		{"networkset-file", 1, 0, 1},
	} {
		s := string(readme)
		open := "<!-- " + tc.block + ":begin -->\n```yaml\n"
		begin := strings.Index(s, open)
		end := strings.Index(s, "```\n<!-- "+tc.block+":end -->")
		if begin < 0 || end < begin {
			t.Fatalf("README.md has no %s block", tc.block)
		}
		res, err := DecodeResources(strings.NewReader(s[begin+len(open) : end]))
		if err != nil {
			t.Fatalf("%s: %v", tc.block, err)
		}
		if len(res.Policies) != tc.policies || len(res.HostEndpoints) != tc.heps || len(res.NetworkSets) != tc.gnsets {
			t.Errorf("%s: %d policies, %d host endpoints, %d network sets", tc.block, len(res.Policies), len(res.HostEndpoints), len(res.NetworkSets))
		}
	}
}
