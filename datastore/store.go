// Package datastore keeps calico-cnm's state as JSON records in etcd v3.
//
// Every mutation is a single etcd transaction whose compares pin the
// ModRevision (or absence) of each key it touches, so concurrent writers on
// different hosts never overwrite each other: the loser gets ErrConflict and
// retries with fresh reads (see Retry).
package datastore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/calico-cnm/calico-cnm/internal/retry"
)

// Errors callers test with errors.Is.
var (
	ErrNotFound    = errors.New("not found in the datastore")
	ErrConflict    = errors.New("concurrent update in the datastore")
	ErrUnavailable = errors.New("datastore unreachable")
)

// DefaultPrefix is where all records live unless configured otherwise.
const DefaultPrefix = "/calico-cnm/v1/"

// Defaults for the embedded member. The client port is etcd's usual one so
// that the CLI finds the local daemon's datastore with no configuration.
const (
	DefaultEmbeddedClientURL = "http://127.0.0.1:2379"
	DefaultEmbeddedPeerURL   = "http://127.0.0.1:2380"
	DefaultRequestTimeout    = 10 * time.Second
	DefaultDialTimeout       = 5 * time.Second
)

// Config selects and tunes the backend. With no Endpoints and Embedded set,
// Open starts an etcd member in this process; otherwise it connects to the
// given cluster. Both paths use the same client code afterwards.
type Config struct {
	Endpoints  []string
	CACertFile string
	CertFile   string
	KeyFile    string

	Prefix         string
	RequestTimeout time.Duration
	DialTimeout    time.Duration

	Embedded          bool
	DataDir           string // embedded member's data directory
	EmbeddedName      string
	EmbeddedClientURL string
	EmbeddedPeerURL   string
	// EmbeddedLogLevel is the embedded member's own (zap) log level; its
	// lines go through the daemon's logrus logger either way. Default:
	// "info" when that logger is at debug, else "warn".
	EmbeddedLogLevel string

	// embeddedCompactEvery is how often the embedded member compacts its
	// history (0: defaultEmbeddedCompactEvery); tests shorten it.
	embeddedCompactEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.EmbeddedClientURL == "" {
		c.EmbeddedClientURL = DefaultEmbeddedClientURL
	}
	if c.EmbeddedPeerURL == "" {
		c.EmbeddedPeerURL = DefaultEmbeddedPeerURL
	}
	if c.EmbeddedName == "" {
		c.EmbeddedName = "calico-cnm"
	}
}

// Stats counts datastore round trips; benchmarks report them per operation.
type Stats struct {
	Reads   int64
	Txns    int64
	Retries int64
}

// Store is a typed view over one etcd keyspace prefix.
type Store struct {
	client  *clientv3.Client
	prefix  string
	timeout time.Duration
	member  *embeddedMember
	log     logrus.FieldLogger
	// diag explains transport failures (TLS refused, ...) in errors.
	diag    *connDiag
	dialFor time.Duration

	reads, txns, retries atomic.Int64
	revs                 revisionGuard
}

// Open connects to (or, embedded, starts and connects to) etcd.
func Open(ctx context.Context, cfg Config, log logrus.FieldLogger) (*Store, error) {
	cfg.setDefaults()
	if log == nil {
		log = logrus.StandardLogger()
	}
	s := &Store{prefix: cfg.Prefix, timeout: cfg.RequestTimeout, log: log, diag: &connDiag{}, dialFor: cfg.DialTimeout}
	endpoints := cfg.Endpoints
	if len(endpoints) == 0 {
		if !cfg.Embedded {
			return nil, fmt.Errorf("no etcd endpoints configured and the embedded member is disabled")
		}
		m, err := startEmbedded(ctx, cfg, log)
		if err != nil {
			return nil, err
		}
		s.member = m
		endpoints = []string{cfg.EmbeddedClientURL}
	}
	var tlsCfg *tls.Config
	if cfg.CACertFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CACertFile}
		c, err := info.ClientConfig()
		if err != nil {
			s.closeMember()
			return nil, fmt.Errorf("loading etcd TLS files: %w", err)
		}
		tlsCfg = c
		for _, ep := range endpoints {
			if u, err := url.Parse(ep); err == nil && u.Scheme == "http" {
				s.closeMember()
				return nil, fmt.Errorf("etcd endpoint %s is plain http but TLS files are configured: use https:// endpoints", ep)
			}
		}
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: cfg.DialTimeout,
		TLS:         tlsCfg,
		Logger:      zap.NewNop(),
		// Fail fast instead of queueing forever while etcd is down: Docker
		// must see an error, not a hung `docker run`.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		// Our transport credentials (the same TLS, or plain text) also
		// record why a connection was refused, for the error messages.
		DialOptions: []grpc.DialOption{s.diag.dialOption(endpoints[0], tlsCfg)},
	})
	if err != nil {
		s.closeMember()
		return nil, fmt.Errorf("%w: connecting to etcd %v: %v", ErrUnavailable, endpoints, err)
	}
	s.client = client
	return s, nil
}

// Close disconnects and stops the embedded member if there is one.
func (s *Store) Close() error {
	var err error
	if s.client != nil {
		err = s.client.Close()
	}
	s.closeMember()
	return err
}

func (s *Store) closeMember() {
	if s.member != nil {
		s.member.close()
		s.member = nil
	}
}

// Client exposes the raw client for the few callers (health checks) that
// need it.
func (s *Store) Client() *clientv3.Client { return s.client }

// Prefix is the keyspace root, ending in "/".
func (s *Store) Prefix() string { return s.prefix }

// RequestTimeout bounds every datastore call (--etcd-timeout).
func (s *Store) RequestTimeout() time.Duration { return s.timeout }

// Stats returns the round trips made so far.
func (s *Store) Stats() Stats {
	return Stats{Reads: s.reads.Load(), Txns: s.txns.Load(), Retries: s.retries.Load()}
}

// KV is one record with the revision a later write must compare against.
type KV struct {
	Key         string // relative to the prefix
	Value       []byte
	ModRevision int64
}

func (s *Store) abs(key string) string { return s.prefix + key }

func (s *Store) rel(key string) string { return strings.TrimPrefix(key, s.prefix) }

// Ping checks that the datastore answers within the request timeout.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.Get(ctx, s.abs("ping"), clientv3.WithCountOnly())
	return s.wrap(err)
}

// Revision is the datastore's current revision (a count-only read): a
// reader of the syncer's memory that must see every write made so far
// waits for it (Syncer.WaitRevision).
func (s *Store) Revision(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.reads.Add(1)
	begin := s.SeenRevision()
	resp, err := s.client.Get(ctx, s.abs(FormatKey), clientv3.WithCountOnly())
	if err != nil {
		return 0, s.wrap(err)
	}
	s.observe(begin, resp.Header.Revision)
	return resp.Header.Revision, nil
}

// Get reads one record; ErrNotFound when absent.
func (s *Store) Get(ctx context.Context, key string) (KV, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.reads.Add(1)
	begin := s.SeenRevision()
	resp, err := s.client.Get(ctx, s.abs(key))
	if err != nil {
		return KV{}, s.wrap(err)
	}
	s.observe(begin, resp.Header.Revision)
	if len(resp.Kvs) == 0 {
		return KV{}, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	kv := resp.Kvs[0]
	return KV{Key: key, Value: kv.Value, ModRevision: kv.ModRevision}, nil
}

// List reads every record under a relative prefix, sorted by key.
func (s *Store) List(ctx context.Context, prefix string) ([]KV, error) {
	kvs, _, err := s.ListWithRevision(ctx, prefix)
	return kvs, err
}

// ListWithRevision also returns the store revision of the read, from which a
// watch can continue without missing events.
func (s *Store) ListWithRevision(ctx context.Context, prefix string) ([]KV, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.reads.Add(1)
	begin := s.SeenRevision()
	resp, err := s.client.Get(ctx, s.abs(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, s.wrap(err)
	}
	s.observe(begin, resp.Header.Revision)
	out := make([]KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, KV{Key: s.rel(string(kv.Key)), Value: kv.Value, ModRevision: kv.ModRevision})
	}
	return out, resp.Header.Revision, nil
}

type opKind int

const (
	opCreate opKind = iota
	opUpdate
	opPut
	opDelete
	opCheck
	opCheckValue
)

// Op is one guarded step of a transaction.
type Op struct {
	kind  opKind
	key   string
	value []byte
	rev   int64
}

// Create writes key only if it does not exist.
func Create(key string, value []byte) Op { return Op{kind: opCreate, key: key, value: value} }

// Update writes key only if its ModRevision is still rev.
func Update(key string, value []byte, rev int64) Op {
	return Op{kind: opUpdate, key: key, value: value, rev: rev}
}

// Write is Create when rev is 0 and Update otherwise: the usual shape of a
// read-modify-write where the read may have found nothing.
func Write(key string, value []byte, rev int64) Op {
	if rev == 0 {
		return Create(key, value)
	}
	return Update(key, value, rev)
}

// Put writes key unconditionally. Only for records with a single writer.
func Put(key string, value []byte) Op { return Op{kind: opPut, key: key, value: value} }

// Delete removes key only if its ModRevision is still rev (rev 0: whatever it is).
func Delete(key string, rev int64) Op { return Op{kind: opDelete, key: key, rev: rev} }

// Check only compares: the transaction fails unless key is still at rev
// (rev 0: key must be absent).
func Check(key string, rev int64) Op { return Op{kind: opCheck, key: key, rev: rev} }

// CheckValue only compares: the transaction fails unless key exists and
// holds exactly value. Unlike a revision, a value means the same in a
// store wiped and restored (whose revisions start again).
func CheckValue(key string, value []byte) Op {
	return Op{kind: opCheckValue, key: key, value: value}
}

// Txn applies all ops atomically, or none when any guard fails (ErrConflict).
func (s *Store) Txn(ctx context.Context, ops ...Op) error {
	_, err := s.TxnRev(ctx, ops...)
	return err
}

// TxnRev is Txn that also returns the store revision the transaction
// committed at, which is the new ModRevision of every key it wrote. Callers
// that keep a record cached (IPAM's affine blocks) use it to guard their next
// write without reading the record back. 0 when ops is empty.
func (s *Store) TxnRev(ctx context.Context, ops ...Op) (int64, error) {
	if len(ops) == 0 {
		return 0, nil
	}
	var cmps []clientv3.Cmp
	var thens []clientv3.Op
	for _, op := range ops {
		k := s.abs(op.key)
		switch op.kind {
		case opCreate:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			thens = append(thens, clientv3.OpPut(k, string(op.value)))
		case opUpdate:
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", op.rev))
			thens = append(thens, clientv3.OpPut(k, string(op.value)))
		case opPut:
			thens = append(thens, clientv3.OpPut(k, string(op.value)))
		case opDelete:
			if op.rev != 0 {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", op.rev))
			}
			thens = append(thens, clientv3.OpDelete(k))
		case opCheck:
			if op.rev == 0 {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			} else {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", op.rev))
			}
		case opCheckValue:
			cmps = append(cmps, clientv3.Compare(clientv3.Value(k), "=", string(op.value)))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.txns.Add(1)
	begin := s.SeenRevision()
	resp, err := s.client.Txn(ctx).If(cmps...).Then(thens...).Commit()
	if err != nil {
		return 0, s.wrap(err)
	}
	s.observe(begin, resp.Header.Revision)
	if !resp.Succeeded {
		keys := make([]string, 0, len(ops))
		for _, op := range ops {
			keys = append(keys, op.key)
		}
		return 0, fmt.Errorf("%w on %s", ErrConflict, strings.Join(keys, ", "))
	}
	return resp.Header.Revision, nil
}

// DefaultRetries bounds optimistic-concurrency retries; with a handful of
// hosts racing for the same block a few rounds always settle it.
const DefaultRetries = 20

// Retry runs fn until it succeeds, fails with something other than
// ErrConflict, or the attempts run out. fn must re-read what it writes.
// The waits between attempts grow, with jitter, so racing hosts spread out.
func (s *Store) Retry(ctx context.Context, fn func(ctx context.Context) error) error {
	var last error
	err := retry.Until(ctx, retry.Conflict(), DefaultRetries, func(ctx context.Context) error {
		last = fn(ctx)
		if !errors.Is(last, ErrConflict) {
			return retry.Permanent(last)
		}
		s.retries.Add(1)
		return last
	}, nil)
	switch {
	case !errors.Is(last, ErrConflict):
		return last
	case ctx.Err() != nil:
		return fmt.Errorf("%w (gave up: %v)", last, ctx.Err())
	default:
		return fmt.Errorf("%w: still conflicting after %d attempts", err, DefaultRetries)
	}
}

// wrap turns transport failures into ErrUnavailable so callers can tell a
// down datastore from a logical error.
func (s *Store) wrap(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	why := ""
	if s.diag != nil {
		if cerr := s.diag.recent(s.timeout + s.dialFor); cerr != nil {
			why = " (" + cerr.Error() + ")"
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: no answer from etcd within %s%s", ErrUnavailable, s.timeout, why)
	}
	if IsUnreachable(err) {
		// The status's own message, not "rpc error: code = ... desc = ...".
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
		}
		return fmt.Errorf("%w: %s%s", ErrUnavailable, msg, why)
	}
	return fmt.Errorf("etcd: %w", err)
}

// EventType says what happened to a watched key.
type EventType int

// Watch event types.
const (
	EventPut EventType = iota
	EventDelete
)

// Event is one change under a watched prefix. Err is set (and the channel
// closed afterwards) when the watch broke; the watcher should re-list.
type Event struct {
	Type        EventType
	Key         string
	Value       []byte
	ModRevision int64
	Err         error
}

// Watch streams changes under prefix after revision fromRev (0: from now).
// The channel closes when ctx is done or the watch fails.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan Event {
	out := make(chan Event, 64)
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if fromRev > 0 {
		opts = append(opts, clientv3.WithRev(fromRev+1))
	}
	// Ended early (with an error event) if the revision goes back.
	wctx, release := s.watchContext(ctx)
	wch := s.client.Watch(wctx, s.abs(prefix), opts...)
	go func() {
		defer close(out)
		defer release()
		for resp := range wch {
			if err := resp.Err(); err != nil {
				select {
				case out <- Event{Err: s.wrap(err)}:
				case <-ctx.Done():
				}
				return
			}
			for _, ev := range resp.Events {
				e := Event{Key: s.rel(string(ev.Kv.Key)), Value: ev.Kv.Value, ModRevision: ev.Kv.ModRevision}
				if ev.Type == clientv3.EventTypeDelete {
					e.Type = EventDelete
				}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
		}
		if ctx.Err() == nil {
			select {
			case out <- Event{Err: fmt.Errorf("%w: watch on %s ended", ErrUnavailable, prefix)}:
			case <-ctx.Done():
			}
		}
	}()
	return out
}
