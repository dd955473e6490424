package plugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/policy"
)

// Policy counter metrics, as the README documents them.
const (
	MetricPolicyRulePackets = "calico_cnm_policy_rule_packets_total"
	MetricPolicyRuleBytes   = "calico_cnm_policy_rule_bytes_total"
	MetricPolicyDenied      = "calico_cnm_policy_denied_packets_total"
	MetricPolicyDeniedBytes = "calico_cnm_policy_denied_bytes_total"
	policyCountersTimeout   = 5 * time.Second
)

// policyCollector reads the policy's nftables counters at each scrape
// (policy.NFT.Counters: the policy chains only, never the sets).
type policyCollector struct {
	read func(ctx context.Context) (policy.Counters, error)
	log  logrus.FieldLogger

	rulePackets, ruleBytes, denied, deniedBytes *prometheus.Desc
}

func newPolicyCollector(read func(ctx context.Context) (policy.Counters, error), log logrus.FieldLogger) *policyCollector {
	rule := []string{"policy", "rule", "action"}
	ep := []string{"endpoint", "direction"}
	return &policyCollector{
		read: read, log: log,
		rulePackets: prometheus.NewDesc(MetricPolicyRulePackets, "Packets that matched a policy rule on this host (new connections: replies are not counted), by policy, rule (direction[index]) and action.", rule, nil),
		ruleBytes:   prometheus.NewDesc(MetricPolicyRuleBytes, "Bytes of the packets counted by "+MetricPolicyRulePackets+".", rule, nil),
		denied:      prometheus.NewDesc(MetricPolicyDenied, "Packets policy denied a local endpoint (a Deny rule, or no rule allowed them), by endpoint id and direction.", ep, nil),
		deniedBytes: prometheus.NewDesc(MetricPolicyDeniedBytes, "Bytes of the packets counted by "+MetricPolicyDenied+".", ep, nil),
	}
}

func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rulePackets
	ch <- c.ruleBytes
	ch <- c.denied
	ch <- c.deniedBytes
}

func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), policyCountersTimeout)
	defer cancel()
	cs, err := c.read(ctx)
	if err != nil {
		c.log.WithError(err).Warn("reading the policy counters for metrics")
		return
	}
	for _, r := range cs.Rules {
		labels := []string{r.Policy, fmt.Sprintf("%s[%d]", strings.ToLower(string(r.Direction)), r.Index), string(r.Action)}
		ch <- prometheus.MustNewConstMetric(c.rulePackets, prometheus.CounterValue, float64(r.Packets), labels...)
		ch <- prometheus.MustNewConstMetric(c.ruleBytes, prometheus.CounterValue, float64(r.Bytes), labels...)
	}
	for _, d := range cs.Denied {
		labels := []string{d.Endpoint, strings.ToLower(string(d.Direction))}
		ch <- prometheus.MustNewConstMetric(c.denied, prometheus.CounterValue, float64(d.Packets), labels...)
		ch <- prometheus.MustNewConstMetric(c.deniedBytes, prometheus.CounterValue, float64(d.Bytes), labels...)
	}
}
