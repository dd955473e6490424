package dataplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// forwardRuleComment marks the rules EnsureForwardAccept owns, so that it
// finds its own and never touches anybody else's.
const forwardRuleComment = "calico-cnm: forward workload traffic"

// workloadIfPrefix is what iptables writes for `-i cali+`: a compare of the
// name's first bytes, without the NUL terminator.
var workloadIfPrefix = []byte(HostIfPrefix)

// EnsureForwardAccept lets routed workload traffic through a FORWARD filter
// whose policy drops it. Docker sets the iptables FORWARD policy to DROP
// when it starts (with its default --iptables=true), which would silently
// black-hole every packet between cali interfaces; Docker's own advice is to
// put such rules in its DOCKER-USER chain, which it never flushes. So: for
// each family's iptables-nft "filter" table, insert `-i cali+ -j ACCEPT` and
// `-o cali+ -j ACCEPT` at the top of DOCKER-USER (or FORWARD when Docker has
// not made DOCKER-USER), once. Nothing happens where no such table exists:
// then nothing filters forwarded traffic. A Docker on the iptables-legacy
// backend keeps its filter in x_tables instead, which nftables does not
// show: ensureLegacyForwardAccept covers that.
func (l *Linux) EnsureForwardAccept(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.ensureLegacyForwardAccept(ctx); err != nil {
		return err
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(l.ns)))
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	for _, family := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		chain, err := forwardChain(conn, family)
		if err != nil {
			return err
		}
		if chain == nil {
			continue
		}
		rules, err := conn.GetRules(chain.Table, chain)
		if err != nil {
			return fmt.Errorf("listing rules of %s: %w", chain.Name, err)
		}
		if hasForwardRules(rules) {
			continue
		}
		for _, key := range []expr.MetaKey{expr.MetaKeyOIFNAME, expr.MetaKeyIIFNAME} {
			conn.InsertRule(&nftables.Rule{
				Table: chain.Table,
				Chain: chain,
				Exprs: []expr.Any{
					&expr.Meta{Key: key, Register: 1},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: workloadIfPrefix},
					&expr.Counter{},
					&expr.Verdict{Kind: expr.VerdictAccept},
				},
				UserData: userdata.AppendString(nil, userdata.TypeComment, forwardRuleComment),
			})
		}
		if err := conn.Flush(); err != nil {
			return fmt.Errorf("inserting the cali+ accept rules into %s: %w", chain.Name, err)
		}
		l.log.WithField("chain", chain.Table.Name+"/"+chain.Name).Info("accepting forwarded traffic of cali+ interfaces (Docker's FORWARD policy drops it)")
	}
	return nil
}

// forwardChain is where the accept rules go in family's table "filter":
// Docker's DOCKER-USER chain, else FORWARD, else nil (no such table or
// chain). It asks for the two chains by name: Join calls it, and a listing
// of the family's chains would read every chain of the host's tables,
// this daemon's thousands of policy chains included.
func forwardChain(conn *nftables.Conn, family nftables.TableFamily) (*nftables.Chain, error) {
	filter := &nftables.Table{Name: "filter", Family: family}
	for _, name := range []string{"DOCKER-USER", "FORWARD"} {
		c, err := conn.ListChain(filter, name)
		switch {
		case err == nil:
			return c, nil
		case !chainMissing(err):
			return nil, fmt.Errorf("reading nftables chain filter/%s: %w", name, err)
		}
	}
	return nil, nil
}

// chainMissing: the kernel answered that the table or chain asked for does
// not exist. The library flattens the errno into its message.
func chainMissing(err error) bool {
	return errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), unix.ENOENT.Error())
}

func hasForwardRules(rules []*nftables.Rule) bool {
	n := 0
	for _, r := range rules {
		if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && c == forwardRuleComment {
			n++
		}
	}
	return n >= 2
}

// removeForwardRules deletes the rules EnsureForwardAccept added; tests use
// it to leave a namespace as they found it.
func (l *Linux) removeForwardRules() error {
	if err := l.removeLegacyForwardRules(context.Background()); err != nil {
		return err
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(l.ns)))
	if err != nil {
		return err
	}
	for _, family := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		chains, err := conn.ListChainsOfTableFamily(family)
		if err != nil {
			return err
		}
		for _, chain := range chains {
			rules, err := conn.GetRules(chain.Table, chain)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && c == forwardRuleComment {
					if err := conn.DelRule(r); err != nil {
						return err
					}
				}
			}
		}
	}
	return conn.Flush()
}
