package datastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodesAlivePrefix holds one key per running daemon, bound to an etcd lease
// the daemon keeps alive: the key goes away with a clean shutdown at once,
// and TTL after a daemon dies or loses the datastore. `node list` shows it,
// `node delete` refuses to remove a node that has one.
const NodesAlivePrefix = "nodes-alive/"

// NodeAliveKey is node's liveness key.
func NodeAliveKey(node string) string { return NodesAlivePrefix + node }

// DefaultAliveTTL is how long a dead daemon still counts as alive.
const DefaultAliveTTL = 15 * time.Second

// Alive is the value of a liveness key: which process holds it.
type Alive struct {
	Node     string    `json:"node"`
	Hostname string    `json:"hostname"`
	PID      int       `json:"pid"`
	Since    time.Time `json:"since"`
}

// ErrAliveElsewhere: the node's liveness key is held by another lease - a
// previous run that died less than a TTL ago, or a second daemon running
// with the same node name.
var ErrAliveElsewhere = errors.New("node is already marked alive by another daemon")

// KeepAlive marks a node alive until ctx ends, then revokes the mark. A
// mark held by somebody else, a lost lease or an unreachable datastore are
// logged and retried every ttl/3; KeepAlive only returns when ctx is done.
func (s *Store) KeepAlive(ctx context.Context, a Alive, ttl time.Duration, log logrus.FieldLogger) {
	if ttl < 2*time.Second {
		ttl = 2 * time.Second
	}
	log = log.WithField("node", a.Node)
	retry := ttl / 3
	warned := ""
	for {
		lease, err := s.markAlive(ctx, a, ttl)
		if err == nil {
			if warned != "" {
				log.Info("node marked alive")
				warned = ""
			}
			s.holdLease(ctx, lease)
			if ctx.Err() != nil {
				return
			}
			log.Warn("lost the node's liveness lease (datastore unreachable for longer than its TTL?); marking it again")
		} else if ctx.Err() == nil && err.Error() != warned {
			log.WithError(err).Warn("could not mark the node alive; retrying")
			warned = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// markAlive creates the key with a fresh lease, only if nobody holds it.
func (s *Store) markAlive(ctx context.Context, a Alive, ttl time.Duration) (clientv3.LeaseID, error) {
	value, err := json.Marshal(a)
	if err != nil {
		return 0, err
	}
	tctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	grant, err := s.client.Grant(tctx, int64(ttl.Round(time.Second)/time.Second))
	if err != nil {
		return 0, s.wrap(err)
	}
	k := s.abs(NodeAliveKey(a.Node))
	// Guarded by absence: a key under somebody else's lease is theirs until
	// it expires; overwriting it would hide a second daemon with our name.
	s.txns.Add(1)
	resp, err := s.client.Txn(tctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(value), clientv3.WithLease(grant.ID))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err == nil && resp.Succeeded {
		return grant.ID, nil
	}
	s.revoke(grant.ID)
	if err != nil {
		return 0, s.wrap(err)
	}
	var holder Alive
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		_ = json.Unmarshal(kvs[0].Value, &holder)
	}
	return 0, fmt.Errorf("%w (pid %d on %s since %s): a previous run that died less than %s ago, or a second daemon with the same node name",
		ErrAliveElsewhere, holder.PID, holder.Hostname, holder.Since.Format(time.RFC3339), ttl)
}

// holdLease keeps the lease alive until ctx ends (then revokes it) or the
// lease is lost.
func (s *Store) holdLease(ctx context.Context, id clientv3.LeaseID) {
	ch, err := s.client.KeepAlive(ctx, id)
	if err == nil {
		for range ch {
		}
	}
	if ctx.Err() != nil {
		s.revoke(id)
	}
}

// revoke drops a lease and its keys, best effort, with its own deadline:
// it runs after the caller's context is done.
func (s *Store) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), min(s.timeout, 3*time.Second))
	defer cancel()
	_, _ = s.client.Revoke(ctx, id)
}

// AliveNodes lists the liveness keys present, by node name.
func (s *Store) AliveNodes(ctx context.Context) (map[string]Alive, error) {
	kvs, err := s.List(ctx, NodesAlivePrefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Alive, len(kvs))
	for _, kv := range kvs {
		var a Alive
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			continue
		}
		out[kv.Key[len(NodesAlivePrefix):]] = a
	}
	return out, nil
}
