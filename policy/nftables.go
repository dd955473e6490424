package policy

import (
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/nft"
)

// TableName is the name of the policy's nftables tables, one per address
// family (ip and ip6). Nothing else in them belongs to anybody else, and
// the policy touches nothing outside them.
const TableName = "calico-cnm"

// The policy describes its tables in package nft's model (nft encodes,
// diffs and applies them); these names keep the compiler's code short.
type (
	Family      = nft.Family
	SetType     = nft.SetType
	Ruleset     = nft.Ruleset
	Table       = nft.Table
	Set         = nft.Set
	BaseChain   = nft.BaseChain
	Chain       = nft.Chain
	MatchKind   = nft.MatchKind
	Match       = nft.Match
	VerdictKind = nft.VerdictKind
	Rule        = nft.Rule
	OpKind      = nft.OpKind
	Op          = nft.Op
)

// Families, set types, match kinds, verdicts and operations of package nft.
const (
	IPv4 = nft.IPv4
	IPv6 = nft.IPv6

	SetAddr   = nft.SetAddr
	SetIfname = nft.SetIfname

	MatchCtEstablished = nft.MatchCtEstablished
	MatchIfname        = nft.MatchIfname
	MatchIfnameSet     = nft.MatchIfnameSet
	MatchAddrSet       = nft.MatchAddrSet
	MatchMark          = nft.MatchMark
	MatchL4Proto       = nft.MatchL4Proto
	MatchPort          = nft.MatchPort
	MatchICMPType      = nft.MatchICMPType
	MatchICMPCode      = nft.MatchICMPCode
	MatchCtDNAT        = nft.MatchCtDNAT

	Accept     = nft.Accept
	Drop       = nft.Drop
	Return     = nft.Return
	Jump       = nft.Jump
	Masquerade = nft.Masquerade
	Goto       = nft.Goto
	Continue   = nft.Continue

	OpAddTable    = nft.OpAddTable
	OpDelTable    = nft.OpDelTable
	OpAddSet      = nft.OpAddSet
	OpDelSet      = nft.OpDelSet
	OpFlushSet    = nft.OpFlushSet
	OpAddElements = nft.OpAddElements
	OpDelElements = nft.OpDelElements
	OpAddChain    = nft.OpAddChain
	OpDelChain    = nft.OpDelChain
	OpFlushChain  = nft.OpFlushChain
	OpAddRule     = nft.OpAddRule
	OpDelRule     = nft.OpDelRule
)

// Diff is nft.Diff of the policy's tables: the plan from cur to want.
func Diff(cur, want Ruleset) []Op { return nft.Diff(TableName, cur, want) }

// NFT is the policy's tables on an nft.Conn: what the syncer programs
// (Apply, Resync), and what the policy reads back (Dump, Counters).
type NFT struct {
	*nft.Tables
	own *nft.Conn // closed by Close: a Conn NewNFT opened for itself
}

// NewNFT opens a connection of its own to the namespace at nsPath ("" =
// the current one): for a command or a test; the daemon shares one
// connection among every table (NFTOn).
func NewNFT(nsPath string, log logrus.FieldLogger) (*NFT, error) {
	c, err := nft.New(nsPath, log)
	if err != nil {
		return nil, err
	}
	return &NFT{Tables: c.Tables(TableName), own: c}, nil
}

// NFTOn is the policy's tables on c, which its owner closes.
func NFTOn(c *nft.Conn) *NFT { return &NFT{Tables: c.Tables(TableName)} }

// Close releases the connection NewNFT opened (none for NFTOn).
func (n *NFT) Close() error {
	if n.own != nil {
		return n.own.Close()
	}
	return nil
}
