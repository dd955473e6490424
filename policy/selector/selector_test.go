package selector

import (
	"errors"
	"strings"
	"testing"
)

// The examples of Calico's selector documentation and libcalico-go's own
// tests: the selector, labels it must select and labels it must not.
func TestEvaluate(t *testing.T) {
	tests := []struct {
		sel   string
		match []Labels
		miss  []Labels
	}{
		{sel: "", match: []Labels{{}, {"a": "b"}}},
		{sel: "all()", match: []Labels{{}, {"a": "b"}}},
		{sel: "a == 'b'", match: []Labels{{"a": "b"}, {"a": "b", "c": "d"}}, miss: []Labels{{}, {"a": "c"}, {"b": "b"}}},
		{sel: `a == "b"`, match: []Labels{{"a": "b"}}, miss: []Labels{{"a": "B"}}},
		{sel: "a != 'b'", match: []Labels{{"a": "c"}, {}}, miss: []Labels{{"a": "b"}}},
		{sel: "has(a)", match: []Labels{{"a": ""}, {"a": "b"}}, miss: []Labels{{}, {"b": "a"}}},
		{sel: "!has(a)", match: []Labels{{}, {"b": "a"}}, miss: []Labels{{"a": ""}}},
		{sel: "a in {'b', 'c'}", match: []Labels{{"a": "b"}, {"a": "c"}}, miss: []Labels{{}, {"a": "d"}}},
		{sel: "a in {}", miss: []Labels{{}, {"a": ""}}},
		{sel: "a not in {'b','c'}", match: []Labels{{}, {"a": "d"}}, miss: []Labels{{"a": "b"}, {"a": "c"}}},
		{sel: "a == 'b' && c == 'd'", match: []Labels{{"a": "b", "c": "d"}}, miss: []Labels{{"a": "b"}, {"c": "d"}}},
		{sel: "a == 'b' || c == 'd'", match: []Labels{{"a": "b"}, {"c": "d"}}, miss: []Labels{{}, {"a": "d"}}},
		// && binds tighter than ||.
		{sel: "a == 'b' || c == 'd' && e == 'f'", match: []Labels{{"a": "b"}, {"c": "d", "e": "f"}}, miss: []Labels{{"c": "d"}, {"e": "f"}}},
		{sel: "(a == 'b' || c == 'd') && e == 'f'", match: []Labels{{"a": "b", "e": "f"}, {"c": "d", "e": "f"}}, miss: []Labels{{"a": "b"}}},
		// ! binds tighter than &&.
		{sel: "!has(a) && has(b)", match: []Labels{{"b": ""}}, miss: []Labels{{"a": "", "b": ""}, {}}},
		{sel: "!(has(a) && has(b))", match: []Labels{{"b": ""}, {}}, miss: []Labels{{"a": "", "b": ""}}},
		{sel: "!!has(a)", match: []Labels{{"a": ""}}, miss: []Labels{{}}},
		{sel: "role == 'frontend' && env in {'prod', 'staging'}", match: []Labels{{"role": "frontend", "env": "prod"}}, miss: []Labels{{"role": "frontend", "env": "dev"}}},
		{sel: "projectcalico.org/network == 'net1'", match: []Labels{{"projectcalico.org/network": "net1"}}, miss: []Labels{{"network": "net1"}}},
		{sel: "  a=='b'&&c=='d'  ", match: []Labels{{"a": "b", "c": "d"}}},
	}
	for _, tc := range tests {
		s, err := Parse(tc.sel)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.sel, err)
			continue
		}
		for _, l := range tc.match {
			if !s.Evaluate(l) {
				t.Errorf("%q does not select %v, want selected", tc.sel, l)
			}
		}
		for _, l := range tc.miss {
			if s.Evaluate(l) {
				t.Errorf("%q selects %v, want not selected", tc.sel, l)
			}
		}
		// The canonical form parses to the same canonical form.
		again, err := Parse(s.String())
		if err != nil || again.String() != s.String() {
			t.Errorf("%q: canonical form %q does not round-trip: %v, %v", tc.sel, s.String(), again, err)
		}
	}
}

func TestCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "all()"},
		{"a=='b'", `a == "b"`},
		{"a in {'c','b','c'}", `a in {"b", "c"}`},
		{"a not in {}", `a not in {}`},
		{"a == 'b' || c == 'd' && e == 'f'", `(a == "b" || (c == "d" && e == "f"))`},
		{"((has(x)))", "has(x)"},
		{`! has(x)`, "!has(x)"},
		{`a == 'say "hi"'`, `a == 'say "hi"'`},
	}
	for _, tc := range tests {
		s, err := Parse(tc.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.in, err)
		}
		if got := s.String(); got != tc.want {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in      string
		pos     int
		wantMsg string
	}{
		{"a == b", 5, "expected a quoted value"},
		{"a = 'b'", 2, "unexpected character"},
		{"a == 'b", 5, "unterminated string"},
		{"has(a", 5, `expected ")"`},
		{"has()", 4, "expected a label name"},
		{"a == 'b' &&", 11, "found end of selector"},
		{"a == 'b' c == 'd'", 9, "after a complete expression"},
		{"(a == 'b'", 9, `expected ")"`},
		{"a in 'b'", 5, `expected "{"`},
		{"a in {'b' 'c'}", 10, `expected "," or "}"`},
		{"a not {'b'}", 6, "expected ==, !=, in or not in"},
		{"a", 1, "expected ==, !=, in or not in"},
		{"all(a)", 4, "all() takes no argument"},
		{"in == 'x'", 0, "keyword"},
		{"a == 'b' & c == 'd'", 9, "unexpected character"},
		{"|| a == 'b'", 0, "expected a label name"},
		{strings.Repeat("(", 200) + "all()" + strings.Repeat(")", 200), 101, "nested more than"},
	}
	for _, tc := range tests {
		_, err := Parse(tc.in)
		var se *Error
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a *selector.Error", tc.in, err)
			continue
		}
		if se.Pos != tc.pos || !strings.Contains(se.Msg, tc.wantMsg) {
			t.Errorf("Parse(%q): error at %d %q, want at %d containing %q", tc.in, se.Pos, se.Msg, tc.pos, tc.wantMsg)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"a == 'b'", "!has(a) || b in {'c'}", "(x not in {'y'}) && all()"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(sel.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", sel.String(), s, err)
		}
		if again.String() != sel.String() {
			t.Fatalf("canonical form not stable: %q -> %q", sel.String(), again.String())
		}
	})
}
