package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/policy"
)

// Env names of the failsafe ports, as the README documents them.
const (
	envFailsafeInbound  = "CALICO_CNM_FAILSAFE_INBOUND_PORTS"
	envFailsafeOutbound = "CALICO_CNM_FAILSAFE_OUTBOUND_PORTS"
)

// failsafeValue is a list of failsafe ports as a flag: "tcp:22,udp:68".
type failsafeValue struct{ ports *[]policy.FailsafePort }

func (v failsafeValue) String() string {
	if v.ports == nil {
		return ""
	}
	s := make([]string, len(*v.ports))
	for i, p := range *v.ports {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (v failsafeValue) Set(s string) error {
	ps, err := policy.ParseFailsafePorts(s)
	if err != nil {
		return err
	}
	*v.ports = ps
	return nil
}

func (failsafeValue) Type() string { return "ports" }

// addFailsafeFlags adds the failsafe port flags, defaulting to the
// environment, else Calico's defaults. The returned check reports an
// environment value that does not parse (serve refuses to start).
func addFailsafeFlags(fs *pflag.FlagSet, cfg *plugin.Config, getenv func(string) string) (check func() error) {
	f := policy.DefaultFailsafe()
	cfg.Failsafe = &f
	in, out := failsafeValue{&f.Inbound}, failsafeValue{&f.Outbound}
	var errs []error
	for _, e := range []struct {
		v   failsafeValue
		env string
	}{{in, envFailsafeInbound}, {out, envFailsafeOutbound}} {
		if s := getenv(e.env); s != "" {
			if err := e.v.Set(s); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", e.env, err))
			}
		}
	}
	fs.Var(in, "failsafe-inbound-ports", "ports host endpoint policy never closes to the host, proto:port list or none (env "+envFailsafeInbound+")")
	fs.Var(out, "failsafe-outbound-ports", "ports host endpoint policy never closes from the host, proto:port list or none (env "+envFailsafeOutbound+")")
	return func() error { return errors.Join(errs...) }
}
