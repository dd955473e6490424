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
