package datastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
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
	Node     string `json:"node"`
	Hostname string `json:"hostname"`
	// EngineID is the Docker engine ID (docker info's ID) of the host,
	// empty when Docker did not answer at startup. It names the holder; it
	// does not prove two hosts apart: clones of a VM on which Docker had
	// run share it (it lives in /etc/docker/key.json, or in the data root
	// for Docker 23+).
	EngineID string    `json:"engineID,omitempty"`
	PID      int       `json:"pid"`
	Since    time.Time `json:"since"`
	// BootID (the kernel's random boot id) and PIDNamespace tell whether
	// PID can be checked from here: same kernel, same pid namespace.
	BootID       string `json:"bootID,omitempty"`
	PIDNamespace string `json:"pidNamespace,omitempty"`
}

// LocalAlive describes this process as holder of node's liveness key.
func LocalAlive(node, engineID string) Alive {
	hostname, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	pidns, _ := os.Readlink("/proc/self/ns/pid")
	return Alive{Node: node, Hostname: hostname, EngineID: engineID, PID: os.Getpid(), Since: time.Now().UTC(),
		BootID: strings.TrimSpace(string(boot)), PIDNamespace: pidns}
}

// String names the holder for error messages.
func (a Alive) String() string {
	engine := a.EngineID
	if engine == "" {
		engine = "unknown"
	}
	return fmt.Sprintf("pid %d on host %s (Docker engine %s), running since %s", a.PID, a.Hostname, engine, a.Since.Format(time.RFC3339))
}

// provablyDead: the holder ran on this kernel in this pid namespace and its
// process is gone - this host's previous run, killed before it could revoke
// its lease. Its key may be taken over at once instead of after its TTL.
// Anything else (another kernel, another pid namespace, a live pid) might
// be a live daemon and is waited out.
func (a Alive) provablyDead(self Alive) bool {
	if a.BootID == "" || a.BootID != self.BootID || a.PIDNamespace == "" || a.PIDNamespace != self.PIDNamespace || a.PID <= 0 || a.PID == self.PID {
		return false
	}
	return errors.Is(syscall.Kill(a.PID, 0), syscall.ESRCH)
}

// ErrAliveElsewhere: the node's liveness key is held by another lease - a
// previous run that died less than a TTL ago, or a second daemon running
// with the same node name.
var ErrAliveElsewhere = errors.New("node name is held by another live daemon")

// HeldError is ErrAliveElsewhere with the holder.
type HeldError struct {
	Node   string
	Holder Alive
	TTL    time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("node name %q is held by another live daemon: %s. Two hosts with one node name would remove each other's endpoints and free each other's addresses; give each host its own NODENAME (--nodename). A daemon that died keeps the name for up to %s",
		e.Node, e.Holder, e.TTL)
}

func (e *HeldError) Unwrap() error { return ErrAliveElsewhere }

// ClaimAlive marks the node alive and returns the lease, waiting while
// another live daemon holds the node name (logged as an error that names
// it) or the datastore is unreachable. It returns only with the mark held
// or with ctx's error.
func (s *Store) ClaimAlive(ctx context.Context, a Alive, ttl time.Duration, log logrus.FieldLogger) (clientv3.LeaseID, error) {
	ttl = max(ttl, 2*time.Second)
	log = log.WithField("node", a.Node)
	warned := ""
	for {
		lease, err := s.markAlive(ctx, a, ttl)
		if err == nil {
			if warned != "" {
				log.Info("node marked alive; serving")
			}
			return lease, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err.Error() != warned {
			if errors.Is(err, ErrAliveElsewhere) {
				log.WithError(err).Error("refusing to serve until the other daemon's lease is gone; retrying")
			} else {
				log.WithError(err).Warn("could not mark the node alive; retrying")
			}
			warned = err.Error()
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(ttl / 3):
		}
	}
}

// KeepAlive marks a node alive until ctx ends, then revokes the mark. A
// mark held by somebody else, a lost lease or an unreachable datastore are
// logged and retried every ttl/3; KeepAlive only returns when ctx is done.
func (s *Store) KeepAlive(ctx context.Context, a Alive, ttl time.Duration, log logrus.FieldLogger) {
	s.KeepAliveFrom(ctx, a, 0, ttl, log)
}

// KeepAliveFrom is KeepAlive starting with lease (from ClaimAlive; 0 =
// none yet).
func (s *Store) KeepAliveFrom(ctx context.Context, a Alive, lease clientv3.LeaseID, ttl time.Duration, log logrus.FieldLogger) {
	ttl = max(ttl, 2*time.Second)
	log = log.WithField("node", a.Node)
	warned := ""
	for {
		var err error
		if lease == 0 {
			lease, err = s.markAlive(ctx, a, ttl)
		}
		if err == nil {
			if warned != "" {
				log.Info("node marked alive")
				warned = ""
			}
			s.holdLease(ctx, lease)
			lease = 0
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
		case <-time.After(ttl / 3):
		}
	}
}

// markAlive creates the key with a fresh lease, only if nobody holds it or
// its holder is provably dead.
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
	put := clientv3.OpPut(k, string(value), clientv3.WithLease(grant.ID))
	// Guarded by absence: a key under somebody else's lease is theirs until
	// it expires; overwriting it would hide a second daemon with our name.
	s.txns.Add(1)
	resp, err := s.client.Txn(tctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(put).
		Else(clientv3.OpGet(k)).
		Commit()
	if err == nil && resp.Succeeded {
		return grant.ID, nil
	}
	if err != nil {
		s.revoke(grant.ID)
		return 0, s.wrap(err)
	}
	var holder Alive
	var rev int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		_ = json.Unmarshal(kvs[0].Value, &holder)
		rev = kvs[0].ModRevision
	}
	if rev != 0 && holder.provablyDead(a) {
		// This host's earlier run, killed: take the key over, guarded by
		// the revision we read.
		s.txns.Add(1)
		resp, err = s.client.Txn(tctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).Then(put).Commit()
		if err == nil && resp.Succeeded {
			return grant.ID, nil
		}
	}
	s.revoke(grant.ID)
	if err != nil {
		return 0, s.wrap(err)
	}
	return 0, &HeldError{Node: a.Node, Holder: holder, TTL: ttl}
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
	return listByName[Alive](ctx, s, NodesAlivePrefix)
}

// listByName reads the JSON records under prefix by the rest of their
// key; unreadable ones are skipped.
func listByName[T any](ctx context.Context, s *Store, prefix string) (map[string]T, error) {
	kvs, err := s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]T, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			continue
		}
		out[kv.Key[len(prefix):]] = v
	}
	return out, nil
}
