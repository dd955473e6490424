// Package selector is Calico's label selector language: the expressions
// that choose endpoints in a policy's spec.selector and in a rule's
// source/destination selector.
//
// Grammar (lowest precedence first):
//
//	expr    = and { "||" and }
//	and     = unary { "&&" unary }
//	unary   = "!" unary | primary
//	primary = "(" expr ")" | "all()" | "has(" key ")"
//	        | key "==" value | key "!=" value
//	        | key "in" set | key "not" "in" set
//	set     = "{" [ value { "," value } ] "}"
//	value   = a single- or double-quoted string
//
// An empty selector selects everything, like all(). As in Calico, `k != 'v'`
// and `k not in {...}` also match endpoints without the label k.
package selector

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Labels are an endpoint's labels.
type Labels map[string]string

// Selector is a parsed selector.
type Selector interface {
	// Evaluate says whether an endpoint with these labels is selected.
	Evaluate(Labels) bool
	// String is the canonical form: the same for selectors that differ
	// only in spacing, quotes or the order of a set's values.
	String() string
}

// Error is a syntax error at a byte offset of the input.
type Error struct {
	Input string
	Pos   int
	Msg   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("selector %q: at position %d: %s", e.Input, e.Pos, e.Msg)
}

// MaxLength bounds a selector's text (they are stored and evaluated often).
const MaxLength = 4096

// Parse parses a selector.
func Parse(s string) (Selector, error) {
	if len(s) > MaxLength {
		return nil, &Error{Input: s, Pos: MaxLength, Msg: fmt.Sprintf("longer than %d bytes", MaxLength)}
	}
	p := &parser{in: s}
	if err := p.lex(); err != nil {
		return nil, err
	}
	if p.peek().kind == tEOF {
		return all{}, nil
	}
	sel, err := p.expr(0)
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tEOF {
		return nil, p.errAt(t, "unexpected "+t.describe()+" after a complete expression")
	}
	return sel, nil
}

// MustParse is Parse for selectors known to be valid (tests, constants).
func MustParse(s string) Selector {
	sel, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return sel
}

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tString
	tEq
	tNe
	tAnd
	tOr
	tNot
	tLParen
	tRParen
	tLBrace
	tRBrace
	tComma
)

type token struct {
	kind tokKind
	pos  int
	text string // identifier or unquoted string
}

func (t token) describe() string {
	switch t.kind {
	case tEOF:
		return "end of selector"
	case tIdent:
		return fmt.Sprintf("%q", t.text)
	case tString:
		return "string " + strconv.Quote(t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

type parser struct {
	in   string
	toks []token
	i    int
}

func (p *parser) errAt(t token, msg string) error { return &Error{Input: p.in, Pos: t.pos, Msg: msg} }

// isKeyChar: Calico's label keys and the words of the language
// ([a-zA-Z0-9_./-], a DNS-prefix and a name).
func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-'
}

func (p *parser) lex() error {
	s := p.in
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return &Error{Input: s, Pos: i, Msg: "unterminated string"}
			}
			p.toks = append(p.toks, token{kind: tString, pos: i, text: s[i+1 : i+1+j]})
			i += j + 2
		case strings.HasPrefix(s[i:], "=="):
			p.toks = append(p.toks, token{kind: tEq, pos: i, text: "=="})
			i += 2
		case strings.HasPrefix(s[i:], "!="):
			p.toks = append(p.toks, token{kind: tNe, pos: i, text: "!="})
			i += 2
		case strings.HasPrefix(s[i:], "&&"):
			p.toks = append(p.toks, token{kind: tAnd, pos: i, text: "&&"})
			i += 2
		case strings.HasPrefix(s[i:], "||"):
			p.toks = append(p.toks, token{kind: tOr, pos: i, text: "||"})
			i += 2
		case strings.IndexByte("!(){},", c) >= 0:
			kind := map[byte]tokKind{'!': tNot, '(': tLParen, ')': tRParen, '{': tLBrace, '}': tRBrace, ',': tComma}[c]
			p.toks = append(p.toks, token{kind: kind, pos: i, text: string(c)})
			i++
		case isKeyChar(c):
			j := i
			for j < len(s) && isKeyChar(s[j]) {
				j++
			}
			p.toks = append(p.toks, token{kind: tIdent, pos: i, text: s[i:j]})
			i = j
		default:
			return &Error{Input: s, Pos: i, Msg: fmt.Sprintf("unexpected character %q", c)}
		}
	}
	p.toks = append(p.toks, token{kind: tEOF, pos: len(s)})
	return nil
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) expect(k tokKind, what string) (token, error) {
	t := p.next()
	if t.kind != k {
		return t, p.errAt(t, fmt.Sprintf("expected %s, found %s", what, t.describe()))
	}
	return t, nil
}

// maxDepth bounds nesting, so that a hostile selector cannot exhaust the
// stack.
const maxDepth = 100

func (p *parser) expr(depth int) (Selector, error) {
	if depth > maxDepth {
		return nil, p.errAt(p.peek(), fmt.Sprintf("nested more than %d levels deep", maxDepth))
	}
	left, err := p.and(depth)
	if err != nil {
		return nil, err
	}
	terms := []Selector{left}
	for p.peek().kind == tOr {
		p.next()
		r, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		terms = append(terms, r)
	}
	if len(terms) == 1 {
		return left, nil
	}
	return or(terms), nil
}

func (p *parser) and(depth int) (Selector, error) {
	left, err := p.unary(depth)
	if err != nil {
		return nil, err
	}
	terms := []Selector{left}
	for p.peek().kind == tAnd {
		p.next()
		r, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		terms = append(terms, r)
	}
	if len(terms) == 1 {
		return left, nil
	}
	return and(terms), nil
}

func (p *parser) unary(depth int) (Selector, error) {
	if p.peek().kind == tNot {
		p.next()
		if depth > maxDepth {
			return nil, p.errAt(p.peek(), fmt.Sprintf("nested more than %d levels deep", maxDepth))
		}
		inner, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return not{inner}, nil
	}
	return p.primary(depth)
}

func (p *parser) primary(depth int) (Selector, error) {
	t := p.next()
	switch t.kind {
	case tLParen:
		inner, err := p.expr(depth + 1)
		if err != nil {
			return nil, err
		}
		if _, err := p.expect(tRParen, `")"`); err != nil {
			return nil, err
		}
		return inner, nil
	case tIdent:
	default:
		return nil, p.errAt(t, "expected a label name, has(), all(), \"!\" or \"(\", found "+t.describe())
	}
	if (t.text == "has" || t.text == "all") && p.peek().kind == tLParen {
		p.next()
		if t.text == "all" {
			if _, err := p.expect(tRParen, `")" (all() takes no argument)`); err != nil {
				return nil, err
			}
			return all{}, nil
		}
		k, err := p.expect(tIdent, "a label name")
		if err != nil {
			return nil, err
		}
		if err := validKey(p, k); err != nil {
			return nil, err
		}
		if _, err := p.expect(tRParen, `")"`); err != nil {
			return nil, err
		}
		return has{k.text}, nil
	}
	if err := validKey(p, t); err != nil {
		return nil, err
	}
	op := p.next()
	switch op.kind {
	case tEq, tNe:
		v, err := p.expect(tString, "a quoted value")
		if err != nil {
			return nil, err
		}
		return eq{key: t.text, value: v.text, neg: op.kind == tNe}, nil
	case tIdent:
		neg := false
		if op.text == "not" {
			neg = true
			op = p.next()
		}
		if op.kind != tIdent || op.text != "in" {
			return nil, p.errAt(op, "expected ==, !=, in or not in after label "+strconv.Quote(t.text)+", found "+op.describe())
		}
		vals, err := p.set()
		if err != nil {
			return nil, err
		}
		return in{key: t.text, values: vals, neg: neg}, nil
	}
	return nil, p.errAt(op, "expected ==, !=, in or not in after label "+strconv.Quote(t.text)+", found "+op.describe())
}

func (p *parser) set() ([]string, error) {
	if _, err := p.expect(tLBrace, `"{"`); err != nil {
		return nil, err
	}
	var vals []string
	if p.peek().kind == tRBrace {
		p.next()
		return vals, nil
	}
	for {
		v, err := p.expect(tString, "a quoted value")
		if err != nil {
			return nil, err
		}
		vals = append(vals, v.text)
		t := p.next()
		switch t.kind {
		case tComma:
			continue
		case tRBrace:
			slices.Sort(vals)
			return slices.Compact(vals), nil
		}
		return nil, p.errAt(t, `expected "," or "}", found `+t.describe())
	}
}

// reserved words cannot be label names (they would read ambiguously).
var reserved = map[string]bool{"has": true, "all": true, "in": true, "not": true}

func validKey(p *parser, t token) error {
	if reserved[t.text] {
		return p.errAt(t, fmt.Sprintf("%q is a keyword, not a label name", t.text))
	}
	return nil
}

type all struct{}

func (all) Evaluate(Labels) bool { return true }
func (all) String() string       { return "all()" }

type has struct{ key string }

func (h has) Evaluate(l Labels) bool { _, ok := l[h.key]; return ok }
func (h has) String() string         { return "has(" + h.key + ")" }

type eq struct {
	key, value string
	neg        bool
}

func (e eq) Evaluate(l Labels) bool {
	v, ok := l[e.key]
	if e.neg {
		return !ok || v != e.value
	}
	return ok && v == e.value
}

func (e eq) String() string {
	op := " == "
	if e.neg {
		op = " != "
	}
	return e.key + op + quote(e.value)
}

type in struct {
	key    string
	values []string // sorted, unique
	neg    bool
}

func (s in) Evaluate(l Labels) bool {
	v, ok := l[s.key]
	if !ok {
		return s.neg
	}
	_, found := slices.BinarySearch(s.values, v)
	return found != s.neg
}

func (s in) String() string {
	q := make([]string, len(s.values))
	for i, v := range s.values {
		q[i] = quote(v)
	}
	op := " in "
	if s.neg {
		op = " not in "
	}
	return s.key + op + "{" + strings.Join(q, ", ") + "}"
}

type not struct{ inner Selector }

func (n not) Evaluate(l Labels) bool { return !n.inner.Evaluate(l) }
func (n not) String() string         { return "!" + n.inner.String() }

type and []Selector

func (a and) Evaluate(l Labels) bool {
	for _, s := range a {
		if !s.Evaluate(l) {
			return false
		}
	}
	return true
}

func (a and) String() string { return join(a, " && ") }

type or []Selector

func (o or) Evaluate(l Labels) bool {
	for _, s := range o {
		if s.Evaluate(l) {
			return true
		}
	}
	return false
}

func (o or) String() string { return join(o, " || ") }

func join(ss []Selector, op string) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = s.String()
	}
	return "(" + strings.Join(parts, op) + ")"
}

// quote uses double quotes unless the value holds one (the language has
// no escapes).
func quote(v string) string {
	if strings.Contains(v, `"`) {
		return "'" + v + "'"
	}
	return `"` + v + `"`
}
