package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// maxApply bounds the policies of one apply: they are written in one etcd
// transaction, and etcd refuses transactions of more than 128 operations
// by default (--max-txn-ops), each policy taking a guard and a write.
const maxApply = 64

// ApplyResult says what Apply did per resource, in input order.
type ApplyResult struct {
	Kind    string
	Name    string
	Created bool // false: an existing resource was replaced
}

// Apply writes policies (already decoded and validated) in one
// transaction: all of them or, on any error, none.
func Apply(ctx context.Context, s *datastore.Store, ps []GlobalNetworkPolicy) ([]ApplyResult, error) {
	return ApplyResources(ctx, s, Resources{Policies: ps})
}

// ApplyResources writes resources of every kind (already decoded and
// validated) in one transaction: all of them or, on any error, none.
// Network sets and host endpoints are written before policies in the
// result, as the policies may select them.
func ApplyResources(ctx context.Context, s *datastore.Store, res Resources) ([]ApplyResult, error) {
	if res.Len() > maxApply {
		return nil, fmt.Errorf("%d resources in one apply: apply at most %d at a time", res.Len(), maxApply)
	}
	type write struct {
		kind, key, name string
		value           []byte
	}
	var ws []write
	for _, n := range res.NetworkSets {
		ws = append(ws, write{KindNetworkSet, NetworkSetKey(n.Metadata.Name), n.Metadata.Name, datastore.MustJSON(n)})
	}
	for _, h := range res.HostEndpoints {
		ws = append(ws, write{KindHostEndpoint, HostEndpointKey(h.Metadata.Name), h.Metadata.Name, datastore.MustJSON(h)})
	}
	for _, p := range res.Policies {
		ws = append(ws, write{KindPolicy, PolicyKey(p.Metadata.Name), p.Metadata.Name, datastore.MustJSON(p)})
	}
	var out []ApplyResult
	err := s.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		ops := make([]datastore.Op, 0, len(ws))
		for _, w := range ws {
			var rev int64
			kv, err := s.Get(ctx, w.key)
			switch {
			case err == nil:
				rev = kv.ModRevision
			case !errors.Is(err, datastore.ErrNotFound):
				return err
			}
			ops = append(ops, datastore.Write(w.key, w.value, rev))
			out = append(out, ApplyResult{Kind: w.kind, Name: w.name, Created: rev == 0})
		}
		return s.Txn(ctx, ops...)
	})
	if err != nil {
		return nil, fmt.Errorf("writing the resources: %w", err)
	}
	return out, nil
}

// ErrPolicyNotFound: no policy of that name.
var ErrPolicyNotFound = errors.New("no such policy")

// Get reads one policy.
func Get(ctx context.Context, s *datastore.Store, name string) (GlobalNetworkPolicy, error) {
	kv, err := s.Get(ctx, PolicyKey(name))
	if errors.Is(err, datastore.ErrNotFound) {
		return GlobalNetworkPolicy{}, fmt.Errorf("policy %q: %w", name, ErrPolicyNotFound)
	}
	if err != nil {
		return GlobalNetworkPolicy{}, err
	}
	p, err := DecodeStored(kv.Value)
	if err != nil {
		return GlobalNetworkPolicy{}, fmt.Errorf("the datastore's record of policy %q is invalid: %w", name, err)
	}
	return p, nil
}

// ListPolicies reads every policy, in evaluation order. Invalid records are
// returned as errors beside the valid policies (they are not enforced).
func ListPolicies(ctx context.Context, s *datastore.Store) ([]GlobalNetworkPolicy, []error, error) {
	kvs, err := s.List(ctx, PoliciesPrefix)
	if err != nil {
		return nil, nil, err
	}
	ps, bad := DecodeRecords(kvs)
	return ps, bad, nil
}

// DecodeRecords decodes policy records (keys under PoliciesPrefix), in
// evaluation order; a record that does not validate, or whose name does
// not match its key, is an error and is left out.
func DecodeRecords(kvs []datastore.KV) ([]GlobalNetworkPolicy, []error) {
	var ps []GlobalNetworkPolicy
	var bad []error
	for _, kv := range kvs {
		p, err := DecodeStored(kv.Value)
		if err == nil && PolicyKey(p.Metadata.Name) != kv.Key {
			err = fmt.Errorf("names policy %q", p.Metadata.Name)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("ignoring policy record %s: %w", kv.Key, err))
			continue
		}
		ps = append(ps, p)
	}
	Sort(ps)
	return ps, bad
}

// Delete removes a policy; ErrPolicyNotFound when there is none.
func Delete(ctx context.Context, s *datastore.Store, name string) error {
	found, err := s.DeleteExisting(ctx, PolicyKey(name))
	if err != nil {
		return fmt.Errorf("deleting policy %q: %w", name, err)
	}
	if !found {
		return fmt.Errorf("policy %q: %w", name, ErrPolicyNotFound)
	}
	return nil
}

// ErrNotFound: no resource of that kind and name.
var ErrNotFound = errors.New("not found")

// GetHostEndpoint reads one host endpoint.
func GetHostEndpoint(ctx context.Context, s *datastore.Store, name string) (HostEndpoint, error) {
	return getRecord(ctx, s, HostEndpointKey(name), "host endpoint", name, DecodeStoredHostEndpoint)
}

// GetNetworkSet reads one network set.
func GetNetworkSet(ctx context.Context, s *datastore.Store, name string) (GlobalNetworkSet, error) {
	return getRecord(ctx, s, NetworkSetKey(name), "network set", name, DecodeStoredNetworkSet)
}

func getRecord[T any](ctx context.Context, s *datastore.Store, key, noun, name string, decode func([]byte) (T, error)) (T, error) {
	var zero T
	kv, err := s.Get(ctx, key)
	if errors.Is(err, datastore.ErrNotFound) {
		return zero, fmt.Errorf("%s %q: %w", noun, name, ErrNotFound)
	}
	if err != nil {
		return zero, err
	}
	v, err := decode(kv.Value)
	if err != nil {
		return zero, fmt.Errorf("the datastore's record of %s %q is invalid: %w", noun, name, err)
	}
	return v, nil
}

// ListHostEndpoints reads every host endpoint, by name; invalid records
// are returned as errors beside the valid ones.
func ListHostEndpoints(ctx context.Context, s *datastore.Store) ([]HostEndpoint, []error, error) {
	return listRecords(ctx, s, HostEndpointsPrefix, DecodeHostEndpointRecord)
}

// ListNetworkSets reads every network set, by name.
func ListNetworkSets(ctx context.Context, s *datastore.Store) ([]GlobalNetworkSet, []error, error) {
	return listRecords(ctx, s, NetworkSetsPrefix, DecodeNetworkSetRecord)
}

func listRecords[T any](ctx context.Context, s *datastore.Store, prefix string, decode func(key string, v []byte) (T, error)) ([]T, []error, error) {
	kvs, err := s.List(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	var out []T
	var bad []error
	for _, kv := range kvs {
		v, err := decode(kv.Key, kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, v)
	}
	return out, bad, nil
}

// DecodeHostEndpointRecord validates a host endpoint record; its name
// must be its key's.
func DecodeHostEndpointRecord(key string, v []byte) (HostEndpoint, error) {
	h, err := DecodeStoredHostEndpoint(v)
	if err == nil && HostEndpointKey(h.Metadata.Name) != key {
		err = fmt.Errorf("names host endpoint %q", h.Metadata.Name)
	}
	if err != nil {
		return HostEndpoint{}, fmt.Errorf("ignoring host endpoint record %s: %w", key, err)
	}
	return h, nil
}

// DecodeNetworkSetRecord validates a network set record; its name must
// be its key's.
func DecodeNetworkSetRecord(key string, v []byte) (GlobalNetworkSet, error) {
	n, err := DecodeStoredNetworkSet(v)
	if err == nil && NetworkSetKey(n.Metadata.Name) != key {
		err = fmt.Errorf("names network set %q", n.Metadata.Name)
	}
	if err != nil {
		return GlobalNetworkSet{}, fmt.Errorf("ignoring network set record %s: %w", key, err)
	}
	return n, nil
}

// DeleteHostEndpoint removes a host endpoint; ErrNotFound when there is none.
func DeleteHostEndpoint(ctx context.Context, s *datastore.Store, name string) error {
	return deleteRecord(ctx, s, HostEndpointKey(name), "host endpoint", name)
}

// DeleteNetworkSet removes a network set; ErrNotFound when there is none.
func DeleteNetworkSet(ctx context.Context, s *datastore.Store, name string) error {
	return deleteRecord(ctx, s, NetworkSetKey(name), "network set", name)
}

func deleteRecord(ctx context.Context, s *datastore.Store, key, noun, name string) error {
	found, err := s.DeleteExisting(ctx, key)
	if err != nil {
		return fmt.Errorf("deleting %s %q: %w", noun, name, err)
	}
	if !found {
		return fmt.Errorf("%s %q: %w", noun, name, ErrNotFound)
	}
	return nil
}

// Kinds are the policy resources' record kinds, for the datastore syncer:
// each decoded (and validated) once per revision.
func Kinds() []datastore.Kind {
	return []datastore.Kind{
		{Prefix: PoliciesPrefix, Decode: func(k string, v []byte) (any, error) {
			ps, errs := DecodeRecords([]datastore.KV{{Key: k, Value: v}})
			if len(errs) > 0 {
				return nil, errs[0]
			}
			return &ps[0], nil
		}},
		{Prefix: HostEndpointsPrefix, Decode: func(k string, v []byte) (any, error) {
			h, err := DecodeHostEndpointRecord(k, v)
			return &h, err
		}},
		{Prefix: NetworkSetsPrefix, Decode: func(k string, v []byte) (any, error) {
			n, err := DecodeNetworkSetRecord(k, v)
			return &n, err
		}},
	}
}
