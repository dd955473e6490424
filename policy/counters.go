package policy

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/calico-cnm/calico-cnm/policy/api"
)

// Counters are the policy's packet counters on this host, both families
// added up: per policy rule, and what policy denied per endpoint.
type Counters struct {
	Rules  []RuleCounter
	Denied []DeniedCounter
}

// DeniedCounter is what policy denied one local endpoint in one
// direction (the counter of its drop rule, see markDeny).
type DeniedCounter struct {
	Endpoint  string
	Direction api.PolicyType
	Packets   uint64
	Bytes     uint64
}

// ruleCommentRE reads back ruleComment (a comment clipped by a very long
// policy name does not match, and is not counted).
var ruleCommentRE = regexp.MustCompile(`^(\S+) (ingress|egress) rule (\d+): (Allow|Deny|Log|Pass)$`)

// counterChain: the chains whose counters Counters reads (policy and
// dispatch chains), by name.
func counterChain(name string) bool {
	for _, p := range []string{policyInPrefix, policyOutPrefix, toEndpointPrefix, fromEndpointPrefix} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Counters reads the counters of the policy and dispatch chains only: no
// set is read (a network set may hold thousands of networks), and no
// other chain, so a scrape costs in proportion to the policies' rules and
// the local endpoints.
func (n *NFT) Counters(ctx context.Context) (Counters, error) {
	var out Counters
	type ruleKey struct {
		policy string
		dir    api.PolicyType
		index  int
		action api.Action
	}
	rules := map[ruleKey]*RuleCounter{}
	denied := map[string]*DeniedCounter{}
	err := n.VisitRules(ctx, counterChain, func(_ Family, _ string, r Rule) {
		if m := ruleCommentRE.FindStringSubmatch(r.Comment); m != nil {
			i, _ := strconv.Atoi(m[3])
			dir := api.Ingress
			if m[2] == "egress" {
				dir = api.Egress
			}
			k := ruleKey{m[1], dir, i, api.Action(m[4])}
			if rules[k] == nil {
				rules[k] = &RuleCounter{Policy: k.policy, Direction: k.dir, Index: k.index, Action: k.action}
			}
			rules[k].Packets += r.Packets
			rules[k].Bytes += r.Bytes
			return
		}
		for _, dir := range []api.PolicyType{api.Ingress, api.Egress} {
			if id, ok := strings.CutPrefix(r.Comment, DeniedComment(dir, "")); ok {
				k := string(dir) + "/" + id
				if denied[k] == nil {
					denied[k] = &DeniedCounter{Endpoint: id, Direction: dir}
				}
				denied[k].Packets += r.Packets
				denied[k].Bytes += r.Bytes
			}
		}
	})
	if err != nil {
		return out, err
	}
	for _, rc := range rules {
		out.Rules = append(out.Rules, *rc)
	}
	for _, d := range denied {
		out.Denied = append(out.Denied, *d)
	}
	slices.SortFunc(out.Rules, func(a, b RuleCounter) int {
		return strings.Compare(fmt.Sprint(a.Policy, a.Direction, a.Index), fmt.Sprint(b.Policy, b.Direction, b.Index))
	})
	slices.SortFunc(out.Denied, func(a, b DeniedCounter) int {
		return strings.Compare(a.Endpoint+string(a.Direction), b.Endpoint+string(b.Direction))
	})
	return out, nil
}
