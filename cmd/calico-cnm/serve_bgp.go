package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/calico-cnm/calico-cnm/routing"
)

// Env names of the BGP settings; IP, IP_AUTODETECTION_METHOD and AS are
// calico/node's, so existing deployment habits carry over.
const (
	envBGP         = "CALICO_CNM_BGP"
	envNodeIP      = "IP"
	envNodeIPv6    = "IP6"
	envAutodetect  = "IP_AUTODETECTION_METHOD"
	envASN         = "AS"
	envBGPListen   = "BGP_LISTEN_ADDRESS"
	envBGPPort     = "BGP_PORT"
	envRestartTime = "BGP_RESTART_TIME"
	envSecretsDir  = "BGP_SECRETS_DIR"
)

// addBGPFlags registers the BGP flags of `serve` on fs, defaulting from env.
func addBGPFlags(fs *pflag.FlagSet, cfg *routing.Config, getenv func(string) string) {
	on, _ := strconv.ParseBool(getenv(envBGP))
	cfg.Enabled = cfg.Enabled || on
	fs.BoolVar(&cfg.Enabled, "bgp", cfg.Enabled, "run the BGP speaker: advertise this host's blocks, install other hosts' (env "+envBGP+"=true)")
	fs.StringVar(&cfg.NodeIP, "bgp-node-ip", getenv(envNodeIP), "this node's BGP IPv4 address (env "+envNodeIP+"; default: autodetect)")
	fs.StringVar(&cfg.NodeIPv6, "bgp-node-ipv6", getenv(envNodeIPv6), "next hop of this node's IPv6 routes (env "+envNodeIPv6+"; default: the first global IPv6 address of the interface with the BGP address; \"none\": no IPv6 routing)")
	fs.StringVar(&cfg.AutodetectMethod, "ip-autodetection-method", getenv(envAutodetect), "first-found (interface of the default route), interface=REGEX or can-reach=ADDR (env "+envAutodetect+")")
	if v, err := strconv.ParseUint(strings.TrimSpace(getenv(envASN)), 10, 32); err == nil {
		cfg.ASN = uint32(v)
	}
	fs.Var(asnFlag{&cfg.ASN}, "bgp-asn", "this node's AS number (env "+envASN+"; default: the node record's, else `bgp config --asn`, else 64512)")
	port := routing.DefaultPort
	if v, err := strconv.Atoi(getenv(envBGPPort)); err == nil {
		port = v
	}
	fs.StringVar(&cfg.ListenAddress, "bgp-listen-address", getenv(envBGPListen), "address the BGP speaker listens on (env "+envBGPListen+"; default: all)")
	fs.IntVar(&cfg.Port, "bgp-port", port, "BGP port, to listen on and to connect to (env "+envBGPPort+")")
	restart := routing.DefaultRestartTime
	if d, err := time.ParseDuration(getenv(envRestartTime)); err == nil {
		restart = d
	}
	fs.DurationVar(&cfg.RestartTime, "bgp-restart-time", restart, "graceful-restart time: how long peers keep this node's routes while it restarts (env "+envRestartTime+")")
	secrets := routing.DefaultSecretsDir
	if v := getenv(envSecretsDir); v != "" {
		secrets = v
	}
	fs.StringVar(&cfg.SecretsDir, "bgp-secrets-dir", secrets, "directory of the BGP password files that peer records name with --password-secret (env "+envSecretsDir+")")
	fs.DurationVar(&cfg.SyncTimeout, "bgp-sync-timeout", routing.DefaultSyncTimeout, "after a start, keep learned kernel routes missing from BGP until every peer sent End-of-RIB or this long")
}

// asnFlag parses an AS number into a uint32.
type asnFlag struct{ p *uint32 }

func (f asnFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(*f.p), 10)
}

func (f asnFlag) Type() string { return "asn" }

func (f asnFlag) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 {
		return usagef("AS number %q: use a number from 1 to 4294967295", s)
	}
	*f.p = uint32(n)
	return nil
}
