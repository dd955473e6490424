package ipam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// MarshalJSON writes the block exactly as encoding/json would from its
// field tags, without reflection: every assignment writes its whole block,
// and with an attribute map per address the reflective encoder was a large
// share of an assignment's CPU. TestBlockJSONMatchesEncodingJSON
// holds the two to the same bytes.
func (b *block) MarshalJSON() ([]byte, error) {
	// Room for a full block of stamped assignments: no growing copies.
	return b.appendJSON(make([]byte, 0, 256+96*len(b.Allocations)))
}

func (b *block) appendJSON(out []byte) ([]byte, error) {
	out = append(out, `{"cidr":`...)
	out = appendJSONString(out, b.CIDR)
	out = append(out, `,"affinity":`...)
	out = appendJSONString(out, b.Affinity)
	out = append(out, `,"allocations":`...)
	if b.Allocations == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i, a := range b.Allocations {
			if i > 0 {
				out = append(out, ',')
			}
			if a == nil {
				out = append(out, "null"...)
			} else {
				out = strconv.AppendInt(out, int64(*a), 10)
			}
		}
		out = append(out, ']')
	}
	out = append(out, `,"unallocated":`...)
	if b.Unallocated == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i, o := range b.Unallocated {
			if i > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendInt(out, int64(o), 10)
		}
		out = append(out, ']')
	}
	out = append(out, `,"attributes":`...)
	if b.Attributes == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i, a := range b.Attributes {
			if i > 0 {
				out = append(out, ',')
			}
			if a.encoded != nil {
				out = append(out, a.encoded...)
			} else {
				out = appendAttributeJSON(out, a)
			}
		}
		out = append(out, ']')
	}
	if b.EmptiedAt != nil {
		out = append(out, `,"emptiedAt":`...)
		t, err := b.EmptiedAt.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("block %s: emptiedAt: %w", b.CIDR, err)
		}
		out = append(out, t...)
	}
	out = append(out, `,"sequence":`...)
	out = strconv.AppendUint(out, b.Sequence, 10)
	return append(out, '}'), nil
}

func appendAttributeJSON(out []byte, a attribute) []byte {
	out = append(out, `{"handleID":`...)
	out = appendJSONString(out, a.HandleID)
	if len(a.Secondary) > 0 {
		out = append(out, `,"secondary":{`...)
		var room [8]string // the usual few attributes, without an allocation
		keys := room[:0]
		for k := range a.Secondary {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendJSONString(out, k)
			out = append(out, ':')
			out = appendJSONString(out, a.Secondary[k])
		}
		out = append(out, '}')
	}
	return append(out, '}')
}

// appendJSONString quotes s as encoding/json does. Strings that need
// escaping (control characters, quotes, HTML characters, non-ASCII) are
// rare in a block and go through encoding/json itself.
func appendJSONString(out []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(out, q...)
		}
	}
	out = append(out, '"')
	out = append(out, s...)
	return append(out, '"')
}

// value is the block's record as written to the datastore. Like
// datastore.MustJSON it panics on what cannot be encoded (an emptiedAt
// outside years 0-9999), without MustJSON's second pass over the bytes.
func (b *block) value() []byte {
	v, err := b.MarshalJSON()
	if err != nil {
		panic(fmt.Sprintf("ipam: encoding block: %v", err))
	}
	return v
}

// peekBlockHead reads a block record's cidr and affinity, which the
// encoder writes first (appendJSON, and encoding/json from the field
// order), without decoding the rest. ok is false for any other shape and
// for a string with an escape: such a record is decoded whole.
func peekBlockHead(raw []byte) (cidr, affinity string, ok bool) {
	rest, ok := bytes.CutPrefix(raw, []byte(`{"cidr":`))
	if !ok {
		return "", "", false
	}
	if cidr, rest, ok = plainJSONString(rest); !ok {
		return "", "", false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"affinity":`)); !ok {
		return "", "", false
	}
	if bytes.HasPrefix(rest, []byte("null")) {
		return cidr, "", true
	}
	if affinity, _, ok = plainJSONString(rest); !ok {
		return "", "", false
	}
	return cidr, affinity, true
}

// plainJSONString reads the JSON string at the head of b when it has no
// escape (its bytes are then the string's).
func plainJSONString(b []byte) (s string, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", nil, false
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 {
		return "", nil, false
	}
	body := b[1 : 1+end]
	for _, c := range body {
		if c < 0x20 || c == '\\' {
			return "", nil, false
		}
	}
	if !utf8.Valid(body) {
		return "", nil, false
	}
	return string(body), b[2+end:], true
}
