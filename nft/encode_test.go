package nft

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TestEncodeDecodeRule: every match kind, statement and verdict that
// EncodeRule writes, DecodeRule reads back equal (no kernel involved).
func TestEncodeDecodeRule(t *testing.T) {
	rules := []Rule{
		{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept},
		{Matches: []Match{{Kind: MatchCtDNAT}}, Verdict: Return},
		{Matches: []Match{{Kind: MatchIfname, In: true, Value: "cali0123"}}, Verdict: Jump, Target: "in-x"},
		{Matches: []Match{{Kind: MatchIfname, Value: "cali", Prefix: true, Negate: true}}, Verdict: Drop},
		{Matches: []Match{{Kind: MatchIfnameSet, In: true, Value: "workloads", Negate: true}, {Kind: MatchIfnameSet, Value: "other"}}, Verdict: Drop},
		{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: "pools"}, {Kind: MatchAddrSet, Value: "hosts", Negate: true}}, Verdict: Masquerade},
		{Matches: []Match{{Kind: MatchMark, Mark: 0x10}, {Kind: MatchMark, Mark: 0x20, Negate: true}}, Verdict: Goto, Target: "g"},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 6}, {Kind: MatchPort, In: true, Min: 7, Max: 7}, {Kind: MatchPort, Min: 50, Max: 60, Negate: true}}, Verdict: Accept},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 17, Negate: true}}, Verdict: Drop},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 1}, {Kind: MatchICMPType, Proto: 8}, {Kind: MatchICMPCode, Proto: 0}}, Verdict: Accept},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 17}, {Kind: MatchPort, Min: 4789, Max: 4789}}, Verdict: Drop},
		{SetMark: 0x4, ClearMark: 0x3, Verdict: Continue},
		{ClearMark: 0x7, Verdict: Return},
		{LogPrefix: "calico-cnm p ", Verdict: Continue},
		{Verdict: Accept, Comment: "plain"},
		{Matches: []Match{{Kind: MatchFibLocal}}, Verdict: Jump, Target: "published"},
		{Matches: []Match{{Kind: MatchCtDNAT}, {Kind: MatchIfname, Value: "cali", Prefix: true}}, Verdict: Masquerade, Comment: "loop"},
	}
	for _, f := range []Family{IPv4, IPv6} {
		for _, want := range rules {
			ex, err := EncodeRule(f, want, nil)
			if err != nil {
				t.Fatalf("%s: encoding %q: %v", f, want.Render(f), err)
			}
			nr := &nftables.Rule{Handle: 9, Exprs: ex}
			if want.Comment != "" {
				nr.UserData = userdata.AppendString(nil, userdata.TypeComment, want.Comment)
			}
			want.Handle = 9
			if got := DecodeRule(f, nr); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: decoded\n%+v\nwant\n%+v", f, got, want)
			}
		}
	}
}

// TestEncodeRuleErrors: what EncodeRule refuses.
func TestEncodeRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Matches: []Match{{Kind: MatchIfname, Value: ""}}, Verdict: Accept}, `interface name "" is not 1 to 15 characters`},
		{Rule{Matches: []Match{{Kind: MatchIfname, Value: "cali0123456789ab"}}, Verdict: Accept}, `interface name "cali0123456789ab" is not 1 to 15 characters`},
		{Rule{Matches: []Match{{Kind: 99}}, Verdict: Accept}, "unsupported match kind 99"},
		{Rule{Verdict: Jump}, "jump without a target chain"},
		{Rule{Verdict: Goto}, "goto without a target chain"},
		{Rule{}, "unsupported verdict 0"},
	} {
		if _, err := EncodeRule(IPv4, tc.rule, nil); err == nil || err.Error() != tc.want {
			t.Errorf("encoding %+v: error %v, want %q", tc.rule, err, tc.want)
		}
	}
}

// TestDecodeRuleUnrecognised: sequences EncodeRule never writes come back
// as a rule with no verdict, equal to no desired rule.
func TestDecodeRuleUnrecognised(t *testing.T) {
	zero4 := make([]byte, 4)
	for name, ex := range map[string][]expr.Any{
		"verdict not last":     {&expr.Verdict{Kind: expr.VerdictAccept}, &expr.Counter{}},
		"unknown verdict":      {&expr.Verdict{Kind: expr.VerdictBreak}},
		"ct with another mask": {&expr.Ct{Key: expr.CtKeySTATE}, &expr.Bitwise{Mask: ctDNATMask}, &expr.Cmp{Op: expr.CmpOpNeq, Data: zero4}},
		"ct cut short":         {&expr.Ct{Key: expr.CtKeySTATE}, &expr.Bitwise{Mask: ctEstablishedMask}},
		"ct mark":              {&expr.Ct{Key: expr.CtKeyMARK}, &expr.Bitwise{Mask: zero4}, &expr.Cmp{Op: expr.CmpOpNeq, Data: zero4}},
		"ifname then counter":  {&expr.Meta{Key: expr.MetaKeyIIFNAME}, &expr.Counter{}},
		"ifname greater than":  {&expr.Meta{Key: expr.MetaKeyIIFNAME}, &expr.Cmp{Op: expr.CmpOpGt, Data: []byte("cali")}},
		"meta alone":           {&expr.Meta{Key: expr.MetaKeyOIFNAME}},
		"meta priority":        {&expr.Meta{Key: expr.MetaKeyPRIORITY}, &expr.Cmp{Op: expr.CmpOpEq, Data: zero4}},
		"address at offset 0":  {&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: 4}, &expr.Lookup{SetName: "s"}},
		"address cut short":    {&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Cmp{Data: zero4[:3]}},
		"payload alone":        {&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}},
		"transport 4 bytes":    {&expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 4}, &expr.Cmp{Data: zero4}},
		"link layer":           {&expr.Payload{Base: expr.PayloadBaseLLHeader, Offset: 0, Len: 4}, &expr.Cmp{Data: zero4}},
		"two logs":             {&expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte("a")}, &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte("b")}},
		"log to a group":       {&expr.Log{Key: 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_GROUP, Data: []byte("a")}},
		"masquerade random":    {&expr.Masq{Random: true}},
		"masquerade not last":  {&expr.Masq{}, &expr.Counter{}},
		"a NAT":                {&expr.NAT{}},
		"mark set from reg 2":  {&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true}, &expr.Counter{}},
	} {
		nr := &nftables.Rule{Handle: 3, Exprs: ex, UserData: userdata.AppendString(nil, userdata.TypeComment, "c")}
		want := Rule{Handle: 3, Comment: "unrecognised: c"}
		if got := DecodeRule(IPv4, nr); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, want %+v", name, got, want)
		}
	}
}

// TestEncodeDecodeAddrAndDNAT: address matches (one address, a prefix)
// and DNAT, the published ports' rules, read back equal in each family.
func TestEncodeDecodeAddrAndDNAT(t *testing.T) {
	for f, addrs := range map[Family][3]string{
		IPv4: {"10.0.0.5/32", "127.0.0.0/8", "10.0.0.5"},
		IPv6: {"fd00::5/128", "fd00::/64", "fd00::5"},
	} {
		one, pfx, to := addrs[0], addrs[1], netip.MustParseAddr(addrs[2])
		for _, want := range []Rule{
			{Matches: []Match{{Kind: MatchAddr, Value: one}, {Kind: MatchL4Proto, Proto: 6}, {Kind: MatchPort, Min: 8080, Max: 8080}}, Verdict: DNAT, NATAddr: to, NATPort: 80},
			{Matches: []Match{{Kind: MatchAddr, In: true, Value: pfx}, {Kind: MatchAddr, Value: one, Negate: true}}, Verdict: Drop},
			{Matches: []Match{{Kind: MatchAddr, In: true, Value: one}, {Kind: MatchAddr, Value: one}}, Verdict: Masquerade},
		} {
			ex, err := EncodeRule(f, want, nil)
			if err != nil {
				t.Fatalf("%s: encoding %q: %v", f, want.Render(f), err)
			}
			want.Handle = 4
			if got := DecodeRule(f, &nftables.Rule{Handle: 4, Exprs: ex}); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: decoded\n%+v\nwant\n%+v", f, got, want)
			}
		}
	}
	// The other family's address is refused, not written as garbage.
	if _, err := EncodeRule(IPv4, Rule{Verdict: DNAT, NATAddr: netip.MustParseAddr("fd00::1"), NATPort: 1}, nil); err == nil {
		t.Error("an IPv6 DNAT target was accepted in the ip table")
	}
	if _, err := EncodeRule(IPv6, Rule{Matches: []Match{{Kind: MatchAddr, Value: "10.0.0.0/8"}}, Verdict: Drop}, nil); err == nil {
		t.Error("an IPv4 prefix was accepted in the ip6 table")
	}
}
