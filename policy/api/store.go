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

// ApplyResult says what Apply did per policy, in input order.
type ApplyResult struct {
	Name    string
	Created bool // false: an existing policy was replaced
}

// Apply writes policies (already decoded and validated) in one
// transaction: all of them or, on any error, none.
func Apply(ctx context.Context, s *datastore.Store, ps []GlobalNetworkPolicy) ([]ApplyResult, error) {
	if len(ps) > maxApply {
		return nil, fmt.Errorf("%d policies in one apply: apply at most %d at a time", len(ps), maxApply)
	}
	var res []ApplyResult
	err := s.Retry(ctx, func(ctx context.Context) error {
		res = res[:0]
		ops := make([]datastore.Op, 0, len(ps))
		for _, p := range ps {
			key := PolicyKey(p.Metadata.Name)
			var rev int64
			kv, err := s.Get(ctx, key)
			switch {
			case err == nil:
				rev = kv.ModRevision
			case !errors.Is(err, datastore.ErrNotFound):
				return err
			}
			ops = append(ops, datastore.Write(key, datastore.MustJSON(p), rev))
			res = append(res, ApplyResult{Name: p.Metadata.Name, Created: rev == 0})
		}
		return s.Txn(ctx, ops...)
	})
	if err != nil {
		return nil, fmt.Errorf("writing the policies: %w", err)
	}
	return res, nil
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
