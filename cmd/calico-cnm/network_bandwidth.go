package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// unsetBandwidth as a flag's value removes that default.
const unsetBandwidth = "none"

// Docker cannot change a network's options after `docker network create`,
// so the defaults live on in the calico network record, where this command
// changes them; every host's daemon follows the record and reshapes the
// endpoints that use the defaults.
func (a *app) networkBandwidthCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bandwidth NETWORK",
		Short: "Show or change the bandwidth defaults of a calico network (docker network create -o calico.bandwidth.*)",
		Long: "Show or change the bandwidth limits a calico network gives endpoints that do not set their own\n" +
			"(labels or driver options org.projectcalico.bandwidth.*). Docker cannot change a network's options\n" +
			"after it was created; this changes them in the calico network record, and every host reshapes the\n" +
			"network's endpoints within a second. A value of \"none\" removes that default.",
		Example: "  calico-cnm network bandwidth net1\n  calico-cnm network bandwidth net1 --ingress 30mbit --egress none",
		Args:    cobra.ExactArgs(1),
	}
	set := map[string]*string{}
	for _, key := range bandwidth.Keys {
		what := "rate (e.g. 50mbit)"
		if strings.HasSuffix(key, "burst") {
			what = "bucket size (e.g. 64k)"
		}
		set[key] = c.Flags().String(key, "", fmt.Sprintf("default %s %s, or %q", key, what, unsetBandwidth))
	}
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			changes := map[string]string{}
			for key, v := range set {
				if c.Flags().Changed(key) {
					changes[bandwidth.NetworkOptionPrefix+key] = *v
				}
			}
			nw, err := setNetworkBandwidth(c.Context(), store, args[0], changes)
			if err != nil {
				return err
			}
			l, _ := bandwidth.ParseNetworkOptions(nw.Options)
			fmt.Fprintf(a.stdout, "network %s: bandwidth defaults %s\n", orDash(nw.Name), l)
			return nil
		})
	}
	return c
}

// findNetwork is the record of the network named ref (name, id or
// unique id prefix).
func findNetwork(ctx context.Context, store *datastore.Store, ref string) (datastore.Network, error) {
	rows, err := listNetworks(ctx, store)
	if err != nil {
		return datastore.Network{}, err
	}
	var found []datastore.Network
	for _, r := range rows {
		if r.Name == ref || r.ID == ref {
			return r.Network, nil
		}
		if len(ref) >= 3 && strings.HasPrefix(r.ID, ref) {
			found = append(found, r.Network)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return datastore.Network{}, fmt.Errorf("no calico network %q (see calico-cnm network list)", ref)
	}
	return datastore.Network{}, fmt.Errorf("%q names %d calico networks: give more of the id", ref, len(found))
}

// setNetworkBandwidth applies changes (option -> value, unsetBandwidth to
// remove) to the network's record in one guarded transaction and returns
// the record written.
func setNetworkBandwidth(ctx context.Context, store *datastore.Store, ref string, changes map[string]string) (datastore.Network, error) {
	nw, err := findNetwork(ctx, store, ref)
	if err != nil || len(changes) == 0 {
		return nw, err
	}
	key := datastore.NetworkKey(nw.ID)
	err = store.Retry(ctx, func(ctx context.Context) error {
		nw = datastore.Network{}
		rev, err := store.GetJSON(ctx, key, &nw)
		if errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("calico network %q was deleted meanwhile", ref)
		}
		if err != nil {
			return err
		}
		if nw.Options == nil {
			nw.Options = map[string]string{}
		}
		for k, v := range changes {
			if v == unsetBandwidth {
				delete(nw.Options, k)
			} else {
				nw.Options[k] = v
			}
		}
		if _, err := bandwidth.ParseNetworkOptions(nw.Options); err != nil {
			return err
		}
		return store.Txn(ctx, datastore.Update(key, datastore.MustJSON(nw), rev))
	})
	return nw, err
}
