package nft

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Conn is the one writer of the project's nftables tables in one network
// namespace, over netlink (no nft binary needed, which the plugin's scratch
// rootfs lacks). Every table the project programs (the policy's, the
// published ports') goes through it: one encoder, one decoder, one diff
// and one batch path, serialised by one mutex. It only ever lists, creates,
// changes and deletes the tables it is asked for by name.
type Conn struct {
	nsFd int // 0: the calling thread's namespace
	ns   *os.File
	log  logrus.FieldLogger

	// mu serialises every batch and guards known.
	mu sync.Mutex
	// known is, per table name, the tables as this Conn last read or
	// programmed them, handles included (absent: unknown, read the
	// kernel). Apply diffs against it instead of reading every rule back
	// from the kernel at each change, which costs time in proportion to
	// the endpoints of the host (Felix keeps its dataplane state the same
	// way). Resync drops it: the periodic resync, and any failure,
	// compare with the kernel again, which repairs what somebody else
	// changed.
	known map[string]*knownTables
}

// knownTables is what Conn knows of the tables of one name: as the kernel
// has them, and the Ruleset whose Apply left them so (nil when they were
// read from the kernel or changed by Execute). The Ruleset lets the next
// Apply skip what it shares with the new one (see DiffFrom).
type knownTables struct {
	tables  Ruleset
	applied *Ruleset
}

// New works on the namespace at nsPath ("" = the current one, the
// daemon's host namespace).
func New(nsPath string, log logrus.FieldLogger) (*Conn, error) {
	if log == nil {
		log = logrus.StandardLogger()
	}
	n := &Conn{log: log, known: map[string]*knownTables{}}
	if nsPath != "" {
		f, err := os.Open(nsPath)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
		}
		n.ns, n.nsFd = f, int(f.Fd())
	}
	return n, nil
}

// Close releases the namespace handle.
func (n *Conn) Close() error {
	if n.ns != nil {
		return n.ns.Close()
	}
	return nil
}

// Tables is the handle of one table name (both families) on a Conn: what
// a package that owns a table programs through.
type Tables struct {
	conn *Conn
	name string
}

// Tables is the handle of the tables called name.
func (n *Conn) Tables(name string) *Tables { return &Tables{conn: n, name: name} }

// Name is the tables' name.
func (t *Tables) Name() string { return t.name }

// Apply: Conn.Apply of these tables.
func (t *Tables) Apply(ctx context.Context, want Ruleset) (int, error) {
	return t.conn.Apply(ctx, t.name, want)
}

// Dump: Conn.Dump of these tables.
func (t *Tables) Dump(ctx context.Context, families ...Family) (Ruleset, error) {
	return t.conn.Dump(ctx, t.name, families...)
}

// Execute: Conn.Execute on these tables.
func (t *Tables) Execute(ctx context.Context, ops []Op) error {
	return t.conn.Execute(ctx, t.name, ops)
}

// Known: Conn.Known of these tables.
func (t *Tables) Known() (Ruleset, bool) { return t.conn.Known(t.name) }

// Resync: Conn.Resync of these tables.
func (t *Tables) Resync() { t.conn.Resync(t.name) }

// Delete: Conn.Delete of these tables.
func (t *Tables) Delete(ctx context.Context) error { return t.conn.Delete(ctx, t.name) }

// RuleCounters: Conn.RuleCounters of a chain of these tables.
func (t *Tables) RuleCounters(f Family, chain string) (map[string]uint64, error) {
	return t.conn.RuleCounters(f, t.name, chain)
}

// VisitRules: Conn.VisitRules of these tables.
func (t *Tables) VisitRules(ctx context.Context, keep func(chain string) bool, visit func(f Family, chain string, r Rule)) error {
	return t.conn.VisitRules(ctx, t.name, keep, visit)
}

// batchBuffer bounds the socket buffers of a batch. A batch gets one
// acknowledgement per message, and the kernel queues all of them before we
// read any: with the default buffer (~200 KB, a few hundred acks) a large
// rewrite would fail with ENOBUFS after the kernel had committed it.
func batchBuffer(ops int) int {
	return max(4<<20, ops*4096)
}

func (n *Conn) conn(bufBytes int) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{}
	if n.nsFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(n.nsFd))
	}
	if bufBytes > 0 {
		opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return forceBuffers(c, bufBytes) }))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	return c, nil
}

// forceBuffers sizes c's send and receive buffers (see batchBuffer).
func forceBuffers(c *netlink.Conn, bufBytes int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		// FORCE: as root (CAP_NET_ADMIN) beyond net.core.*mem_max.
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufBytes); e != nil {
			serr = e
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufBytes)
	}); err != nil {
		return err
	}
	return serr
}

func tableFamily(f Family) nftables.TableFamily {
	if f == IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func ourTable(name string, f Family) *nftables.Table {
	return &nftables.Table{Name: name, Family: tableFamily(f)}
}

// Dump reads the tables called name of the given families back into the
// model: what Diff compares against. Rules it cannot decode (somebody
// else's, added by hand) come back with an empty verdict, so they never
// equal a desired rule and get deleted.
func (n *Conn) Dump(ctx context.Context, name string, families ...Family) (Ruleset, error) {
	var rs Ruleset
	if err := ctx.Err(); err != nil {
		return rs, err
	}
	// Large buffers: a set of thousands of networks comes back in many
	// messages, and a receive buffer that overflows loses some silently.
	c, err := n.conn(batchBuffer(0))
	if err != nil {
		return rs, err
	}
	for _, f := range families {
		tables, err := c.ListTablesOfFamily(tableFamily(f))
		if err != nil {
			return rs, fmt.Errorf("listing %s tables: %w", f, err)
		}
		found := slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name })
		if !found {
			continue
		}
		t, err := dumpTable(c, name, f)
		if err != nil {
			return rs, fmt.Errorf("reading table %s %s: %w", f, name, err)
		}
		rs.Tables = append(rs.Tables, t)
	}
	return rs, nil
}

func dumpTable(c *nftables.Conn, name string, f Family) (Table, error) {
	t := Table{Family: f}
	nt := ourTable(name, f)
	sets, err := c.GetSets(nt)
	if err != nil {
		return t, fmt.Errorf("listing sets: %w", err)
	}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return t, fmt.Errorf("listing elements of set %s: %w", s.Name, err)
		}
		t.Sets = append(t.Sets, decodeSet(f, s, elems))
	}
	chains, err := c.ListChainsOfTableFamily(tableFamily(f))
	if err != nil {
		return t, fmt.Errorf("listing chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != name {
			continue
		}
		dc := Chain{Name: ch.Name}
		if ch.Hooknum != nil {
			b := &BaseChain{Type: string(ch.Type), Hook: hookName(*ch.Hooknum)}
			if ch.Priority != nil {
				b.Priority = int32(*ch.Priority)
			}
			if ch.Policy != nil && *ch.Policy != nftables.ChainPolicyAccept {
				b.Hook += " (policy not accept)" // never equal to ours: replaced
			}
			dc.Base = b
		}
		rules, err := c.GetRules(nt, ch)
		if err != nil {
			return t, fmt.Errorf("listing rules of chain %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			dc.Rules = append(dc.Rules, DecodeRule(f, r))
		}
		t.Chains = append(t.Chains, dc)
	}
	return t, nil
}

// Execute applies ops to the tables called name as one netlink batch: all
// of them or none. The next Apply reads the tables from the kernel.
func (n *Conn) Execute(ctx context.Context, name string, ops []Op) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.known, name)
	_, err := n.execute(ctx, name, ops)
	return err
}

// execute is Execute that also returns the kernel's handles of the rules
// the OpAddRule ops created, by index in ops (from the kernel's echo of
// each new rule; a handle it did not echo is missing).
func (n *Conn) execute(ctx context.Context, name string, ops []Op) (map[int]uint64, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, echo, err := n.echoConn(batchBuffer(len(ops)))
	if err != nil {
		return nil, err
	}
	defer echo.close()
	b := &nftBatch{name: name, c: c, setIDs: map[string]uint32{}}
	var ruleOps []int // the index in ops of each rule added, in batch order
	for i, op := range ops {
		if err := b.add(op); err != nil {
			return nil, err
		}
		if op.Kind == OpAddRule {
			ruleOps = append(ruleOps, i)
		}
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables batch of %d changes failed (nothing was changed): %w", len(ops), err)
	}
	return echo.handles(ops, ruleOps), nil
}

// newRuleType is the netlink message type of a new rule, and of the
// kernel's echo of it.
const newRuleType = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE)

// ruleEcho relays a batch between an nftables.Conn and a netlink socket
// of its own, noting the sequence number of each new rule sent and the
// handle the kernel's echo gives it back (nftables.Conn asks for the
// echo, but drops it).
type ruleEcho struct {
	conn    *netlink.Conn
	sent    []uint32          // sequence numbers of the new rules, in order
	echoed  map[uint32]uint64 // sequence number -> handle
	chainOf map[uint32]string // sequence number -> chain echoed
}

// echoConn is an nftables connection whose replies pass through a
// ruleEcho; bufBytes sizes the socket's buffers.
func (n *Conn) echoConn(bufBytes int) (*nftables.Conn, *ruleEcho, error) {
	nc, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.nsFd})
	if err != nil {
		return nil, nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	if err := forceBuffers(nc, bufBytes); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("sizing the nftables netlink buffers: %w", err)
	}
	e := &ruleEcho{conn: nc, echoed: map[uint32]uint64{}, chainOf: map[uint32]string{}}
	c, err := nftables.New(nftables.WithTestDial(e.relay))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	return c, e, nil
}

func (e *ruleEcho) close() { e.conn.Close() }

// relay is the nltest.Func of the connection: requests (non-nil) are sent
// on the socket, a nil request receives.
func (e *ruleEcho) relay(req []netlink.Message) ([]netlink.Message, error) {
	if req != nil {
		for i := range req {
			req[i].Header.PID = 0 // the socket's own port id
			if req[i].Header.Type == newRuleType {
				e.sent = append(e.sent, req[i].Header.Sequence)
			}
		}
		_, err := e.conn.SendMessages(req)
		return nil, err
	}
	msgs, err := e.conn.Receive()
	for _, m := range msgs {
		if m.Header.Type == newRuleType {
			e.note(m)
		}
	}
	return msgs, err
}

// note reads the handle and chain of an echoed rule.
func (e *ruleEcho) note(m netlink.Message) {
	if len(m.Data) < 4 {
		return
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_HANDLE:
			e.echoed[m.Header.Sequence] = ad.Uint64()
		case unix.NFTA_RULE_CHAIN:
			e.chainOf[m.Header.Sequence] = ad.String()
		}
	}
}

// handles maps the echoed handles to the ops (ruleOps: the index of each
// new rule's op, in the order they were sent). A rule whose echo is
// missing or names another chain gets none.
func (e *ruleEcho) handles(ops []Op, ruleOps []int) map[int]uint64 {
	out := map[int]uint64{}
	if len(e.sent) != len(ruleOps) {
		return out
	}
	for k, seq := range e.sent {
		i := ruleOps[k]
		if h, ok := e.echoed[seq]; ok && e.chainOf[seq] == ops[i].Chain {
			out[i] = h
		}
	}
	return out
}

// nftBatch queues one Execute's operations on its connection.
type nftBatch struct {
	name string // the tables'

	c      *nftables.Conn
	setIDs map[string]uint32 // family/name -> id, sets created in this batch
}

// idsOf are the ids of the sets of family f created in this batch, by name.
func (b *nftBatch) idsOf(f Family) map[string]uint32 {
	m := map[string]uint32{}
	for k, v := range b.setIDs {
		if fam, name, ok := cutFamily(k); ok && fam == f {
			m[name] = v
		}
	}
	return m
}

// add queues op.
func (b *nftBatch) add(op Op) error {
	t := ourTable(b.name, op.Family)
	switch op.Kind {
	case OpAddTable:
		b.c.AddTable(t)
	case OpDelTable:
		b.c.DelTable(t)
		for k := range b.setIDs {
			if fam, _, _ := cutFamily(k); fam == op.Family {
				delete(b.setIDs, k)
			}
		}
	case OpAddSet:
		return b.addSet(op)
	case OpDelSet:
		b.c.DelSet(&nftables.Set{Table: t, Name: op.Set.Name})
	case OpFlushSet:
		b.c.FlushSet(&nftables.Set{Table: t, Name: op.Set.Name})
	case OpAddElements, OpDelElements:
		return b.changeElements(op)
	case OpAddChain:
		return b.addChain(op)
	case OpDelChain:
		b.c.DelChain(&nftables.Chain{Name: op.Chain, Table: t})
	case OpFlushChain:
		b.c.FlushChain(&nftables.Chain{Name: op.Chain, Table: t})
	case OpAddRule:
		return b.addRule(op)
	case OpDelRule:
		if err := b.c.DelRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: op.Chain, Table: t}, Handle: op.Rule.Handle}); err != nil {
			return fmt.Errorf("deleting rule %d of chain %s: %w", op.Rule.Handle, op.Chain, err)
		}
	default:
		return fmt.Errorf("unsupported operation %d", op.Kind)
	}
	return nil
}

// addSet creates a set with its elements; later operations of the batch
// refer to it by its id.
func (b *nftBatch) addSet(op Op) error {
	ns := nftSet(b.name, op.Family, op.Set)
	elems, err := setElements(op.Family, op.Set)
	if err != nil {
		return err
	}
	chunks := elementChunks(elems)
	if err := b.c.AddSet(ns, chunks[0]); err != nil {
		return fmt.Errorf("adding set %s: %w", op.Set.Name, err)
	}
	for _, more := range chunks[1:] {
		if err := b.c.SetAddElements(ns, more); err != nil {
			return fmt.Errorf("adding elements to set %s: %w", op.Set.Name, err)
		}
	}
	b.setIDs[string(op.Family)+"/"+op.Set.Name] = ns.ID
	return nil
}

// maxElementsPerMessage keeps a set element message's element list under
// netlink's 64 KiB attribute length (an IPv6 interval element with its
// attributes takes about 40 bytes); a longer list would be cut short by
// the length wrapping around, and the kernel take part of it.
const maxElementsPerMessage = 1024

// elementChunks splits elements into lists a message can carry, never
// between a range's start and its end. There is always a first chunk.
func elementChunks(elems []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	for len(elems) > maxElementsPerMessage {
		cut := maxElementsPerMessage
		for cut < len(elems) && elems[cut].IntervalEnd {
			cut++
		}
		out = append(out, elems[:cut])
		elems = elems[cut:]
	}
	return append(out, elems)
}

// changeElements adds or deletes elements of a set.
func (b *nftBatch) changeElements(op Op) error {
	ns := nftSet(b.name, op.Family, op.Set)
	ns.ID = b.setIDs[string(op.Family)+"/"+op.Set.Name]
	elems, err := setElements(op.Family, op.Set)
	if err != nil {
		return err
	}
	for _, chunk := range elementChunks(elems) {
		if op.Kind == OpAddElements {
			err = b.c.SetAddElements(ns, chunk)
		} else {
			err = b.c.SetDeleteElements(ns, chunk)
		}
		if err != nil {
			return fmt.Errorf("changing elements of set %s: %w", op.Set.Name, err)
		}
	}
	return nil
}

// addChain creates a regular chain, or a base chain on its hook.
func (b *nftBatch) addChain(op Op) error {
	ch := &nftables.Chain{Name: op.ChainDef.Name, Table: ourTable(b.name, op.Family)}
	if base := op.ChainDef.Base; base != nil {
		hook, err := hookNum(base.Hook)
		if err != nil {
			return err
		}
		prio := nftables.ChainPriority(base.Priority)
		policy := nftables.ChainPolicyAccept
		ch.Type, ch.Hooknum, ch.Priority, ch.Policy = nftables.ChainType(base.Type), hook, &prio, &policy
	}
	b.c.AddChain(ch)
	return nil
}

// addRule appends a rule to its chain, its comment as user data.
func (b *nftBatch) addRule(op Op) error {
	ex, err := EncodeRule(op.Family, op.Rule, b.idsOf(op.Family))
	if err != nil {
		return fmt.Errorf("rule %q: %w", op.Rule.Render(op.Family), err)
	}
	var ud []byte
	if cm := ClipComment(op.Rule.Comment); cm != "" {
		ud = userdata.AppendString(nil, userdata.TypeComment, cm)
	}
	t := ourTable(b.name, op.Family)
	b.c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: op.Chain, Table: t}, Exprs: ex, UserData: ud})
	return nil
}

func cutFamily(k string) (Family, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return Family(k[:i]), k[i+1:], true
		}
	}
	return "", "", false
}

// Apply makes the tables called name equal to want, changing only what
// differs, in one batch; tables of other names are never touched. What
// differs is judged against the tables as Apply last left them (see known),
// or read from the kernel after Resync or a failure. If the batch fails
// (the kernel refused some change, or the remembered tables were not the
// kernel's any more), it compares with the kernel's tables and, failing
// again, rewrites them whole, also in one batch. It returns the number of
// changes made. want must not be changed afterwards: the next Apply skips
// what the two share (DiffFrom).
func (n *Conn) Apply(ctx context.Context, name string, want Ruleset) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if known := n.known[name]; known != nil {
		cur := known.tables
		ops := DiffFrom(name, cur, known.applied, want)
		if len(ops) == 0 {
			known.applied = &want
			return 0, nil
		}
		handles, err := n.execute(ctx, name, ops)
		if err == nil {
			n.remember(name, cur, ops, handles, &want)
			return len(ops), nil
		}
		delete(n.known, name)
		if ctx.Err() != nil {
			return 0, err
		}
		n.log.WithError(err).WithField("table", name).Warn("updating the nftables tables from what was last programmed failed; reading them from the kernel")
	}
	return n.applyFromKernel(ctx, name, want)
}

// Resync makes the next Apply of the tables called name read the kernel's
// tables instead of trusting what it last programmed.
func (n *Conn) Resync(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.known, name)
}

// Known is what the next Apply of the tables called name will diff
// against instead of reading the kernel; ok is false when it will read
// the kernel. It lets a test check that what Apply remembers is what the
// kernel has. rs is valid until the next Apply, which changes its arrays
// in place.
func (n *Conn) Known(name string) (rs Ruleset, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if k := n.known[name]; k != nil {
		return k.tables, true
	}
	return Ruleset{}, false
}

// remember records the tables after ops were applied to cur, ops being
// the plan to want (nil: not a Ruleset's plan); when that cannot be told
// exactly, the next Apply reads the kernel.
func (n *Conn) remember(name string, cur Ruleset, ops []Op, handles map[int]uint64, want *Ruleset) {
	next, ok := afterOps(cur, ops, handles, want, true)
	if !ok {
		n.log.WithField("table", name).Debug("cannot tell the nftables tables after a change; the next change reads them from the kernel")
		delete(n.known, name)
		return
	}
	n.known[name] = &knownTables{tables: next, applied: want}
}

// applyFromKernel is Apply against the kernel's tables as read now.
func (n *Conn) applyFromKernel(ctx context.Context, name string, want Ruleset) (int, error) {
	cur, err := n.Dump(ctx, name, IPv4, IPv6)
	if err != nil {
		return 0, err
	}
	ops := Diff(name, cur, want)
	if len(ops) == 0 {
		n.known[name] = &knownTables{tables: cur, applied: &want}
		return 0, nil
	}
	handles, err := n.execute(ctx, name, ops)
	if err == nil {
		n.remember(name, cur, ops, handles, &want)
		return len(ops), nil
	}
	if ctx.Err() != nil {
		// The daemon is stopping (or the caller gave up): nothing to
		// rewrite, and nothing to warn of.
		return 0, err
	}
	n.log.WithError(err).WithField("table", name).Warn("updating the nftables tables in place failed; rewriting them")
	var full []Op
	for _, t := range want.sortedTables() {
		_, exists := cur.Table(t.Family)
		full = append(full, ReplaceTable(name, t, exists)...)
	}
	for _, t := range cur.sortedTables() {
		if _, ok := want.Table(t.Family); !ok {
			full = append(full, Op{Kind: OpDelTable, Table: name, Family: t.Family})
		}
	}
	handles, err2 := n.execute(ctx, name, full)
	if err2 != nil {
		return 0, fmt.Errorf("rewriting the nftables tables %s: %w (in-place update: %v)", name, err2, err)
	}
	n.remember(name, cur, full, handles, &want)
	return len(full), nil
}

// Delete removes the tables called name (both families); absent ones are
// fine. The daemon never calls it on shutdown: the rules must keep
// protecting running containers while it restarts.
func (n *Conn) Delete(ctx context.Context, name string) error {
	cur, err := n.Dump(ctx, name, IPv4, IPv6)
	if err != nil {
		return err
	}
	var ops []Op
	for _, t := range cur.sortedTables() {
		ops = append(ops, Op{Kind: OpDelTable, Table: name, Family: t.Family})
	}
	return n.Execute(ctx, name, ops)
}

// RuleCounters reads the packet counters of a chain of the tables called
// name, by rule comment: what the VXLAN filter dropped, for example.
func (n *Conn) RuleCounters(f Family, name, chain string) (map[string]uint64, error) {
	c, err := n.conn(0)
	if err != nil {
		return nil, err
	}
	rules, err := c.GetRules(ourTable(name, f), &nftables.Chain{Name: chain, Table: ourTable(name, f)})
	if err != nil {
		return nil, fmt.Errorf("reading chain %s: %w", chain, err)
	}
	out := map[string]uint64{}
	for _, r := range rules {
		comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				out[comment] += ctr.Packets
			}
		}
	}
	return out, nil
}

// VisitRules calls visit with every rule (decoded, counters included) of
// the chains of the tables called name that keep accepts, both families.
// No set is read (a set may hold thousands of networks), and no other
// chain, so a scrape costs in proportion to the chains asked for.
func (n *Conn) VisitRules(ctx context.Context, name string, keep func(chain string) bool, visit func(f Family, chain string, r Rule)) error {
	c, err := n.conn(batchBuffer(0))
	if err != nil {
		return err
	}
	for _, f := range []Family{IPv4, IPv6} {
		if err := ctx.Err(); err != nil {
			return err
		}
		tables, err := c.ListTablesOfFamily(tableFamily(f))
		if err != nil {
			return fmt.Errorf("listing %s tables: %w", f, err)
		}
		if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name }) {
			continue
		}
		chains, err := c.ListChainsOfTableFamily(tableFamily(f))
		if err != nil {
			return fmt.Errorf("listing %s chains: %w", f, err)
		}
		for _, ch := range chains {
			if ch.Table == nil || ch.Table.Name != name || !keep(ch.Name) {
				continue
			}
			nrs, err := c.GetRules(ourTable(name, f), ch)
			if err != nil {
				return fmt.Errorf("reading chain %s: %w", ch.Name, err)
			}
			for _, nr := range nrs {
				visit(f, ch.Name, DecodeRule(f, nr))
			}
		}
	}
	return nil
}
