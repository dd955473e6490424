package driver

import (
	"slices"
	"testing"
)

// TestSandboxIndex: the candidates of a sandbox follow fill, add and
// forget; an endpoint noted for another sandbox moves.
func TestSandboxIndex(t *testing.T) {
	var x sandboxIndex
	if x.isBuilt() {
		t.Fatal("built before any read")
	}
	x.fill(map[string]string{"e1": "sb1", "e2": "sb1", "e3": "sb2"})
	steps := []struct {
		name string
		do   func()
		sb   string
		want []string
	}{
		{"filled", func() {}, "sb1", []string{"e1", "e2"}},
		{"added", func() { x.add("sb1", "e4") }, "sb1", []string{"e1", "e2", "e4"}},
		{"no sandbox key: nothing noted", func() { x.add("", "e5") }, "", nil},
		{"moved to another sandbox", func() { x.add("sb2", "e1") }, "sb1", []string{"e2", "e4"}},
		{"and found there", func() {}, "sb2", []string{"e1", "e3"}},
		{"forgotten", func() { x.forget("e3"); x.forget("e3") }, "sb2", []string{"e1"}},
		{"the last one forgotten", func() { x.forget("e1") }, "sb2", nil},
		{"unknown sandbox", func() {}, "sb9", nil},
	}
	for _, st := range steps {
		st.do()
		if got := x.candidates(st.sb); !slices.Equal(got, st.want) {
			t.Errorf("%s: candidates(%q) = %v, want %v", st.name, st.sb, got, st.want)
		}
	}
	if !x.isBuilt() {
		t.Error("not built after fill")
	}
}
