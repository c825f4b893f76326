package meta

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
)

// Group commit. Creates and removes that arrive while earlier ones are
// committing are run together in one store transaction: each operation's
// closure runs in turn on the same transaction (a later one reads what an
// earlier one wrote, so the group means the same as running them one after
// another), and one durable commit serves them all. A mount pipelines its
// creates and unlinks (many in flight), and many clients share a server,
// so under load the store sees one commit per group instead of one per
// operation (on the embedded etcd, commits and their round trips are what
// bound creates).
//
// Each operation keeps its own outcome: an operation whose closure fails
// (the name exists, the parent is gone, its caller gave up) before it
// wrote anything gets its error and the group goes on; one that fails
// after writing (a directory found not empty) is answered with its error
// and taken out, and the rest run again without it (a group that has to
// twice runs its remaining operations one by one). An
// operation is answered only after the transaction holding it committed,
// so an answered create is as durable as before. Request ids work as for
// withIdem: each operation reads and stores its own idempotency record in
// the group's transaction.
//
// At most groupLeaders groups commit at once (the store overlaps their
// commits); an operation arriving when all are busy waits for the next
// group. With little load every group holds one operation.
const (
	maxGroupOps  = 64
	groupLeaders = 4
)

type groupOp struct {
	ctx   context.Context
	req   string
	comps []string // the path it works on (what to prefetch)
	fn    func(tx kv.Txn) (any, error)
	res   []byte
	err   error
	done  chan struct{}
}

type grouper struct {
	mu      sync.Mutex
	queue   []*groupOp // guarded by mu
	leaders int        // guarded by mu: groups being committed
	max     int        // leaders allowed; 0: groupLeaders (tests set 1)

	idle chan struct{} // guarded by mu: closed while leaders == 0 (nil: idle)

	groups  atomic.Int64 // groups committed (for tests and metrics)
	grouped atomic.Int64 // operations answered by those groups
}

// errGroupOpFailed stops a group's transaction when one of its operations
// failed (its error is kept aside).
var errGroupOpFailed = errors.New("meta: an operation of the group failed")

// withIdemGrouped is withIdem for operations that may share a
// transaction with concurrent ones (see the comment above).
// comps is the operation's path (its reads are prefetched, prefetch.go).
func (s *Service) withIdemGrouped(ctx context.Context, req string, comps []string, fn func(tx kv.Txn) (any, error), out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &groupOp{ctx: ctx, req: req, comps: comps, fn: fn, done: make(chan struct{})}
	g := &s.group
	g.mu.Lock()
	g.queue = append(g.queue, op)
	limit := g.max
	if limit <= 0 {
		limit = groupLeaders
	}
	lead := g.leaders < limit
	if lead {
		if g.leaders == 0 {
			g.idle = make(chan struct{})
		}
		g.leaders++
	}
	g.mu.Unlock()
	if lead {
		s.lead(op)
	}
	<-op.done
	if op.err != nil {
		return op.err
	}
	if out != nil && len(op.res) > 0 {
		return json.Unmarshal(op.res, out)
	}
	return nil
}

// lead commits groups from the queue until own is answered; if work is
// left then, a goroutine goes on leading in its place (it ends when the
// queue is empty), so the caller is answered without waiting for others.
func (s *Service) lead(own *groupOp) {
	g := &s.group
	for {
		g.mu.Lock()
		n := min(len(g.queue), maxGroupOps)
		if n == 0 {
			g.leaders--
			if g.leaders == 0 {
				close(g.idle)
				g.idle = nil
			}
			g.mu.Unlock()
			return
		}
		if own != nil && isDone(own) {
			g.mu.Unlock()
			go s.lead(nil) // keeps this leader's slot
			return
		}
		batch := slices.Clone(g.queue[:n])
		g.queue = slices.Delete(g.queue, 0, n)
		g.mu.Unlock()
		s.commitGroup(batch)
	}
}

func isDone(op *groupOp) bool {
	select {
	case <-op.done:
		return true
	default:
		return false
	}
}

// commitGroup runs ops in one transaction and answers each.
func (s *Service) commitGroup(ops []*groupOp) {
	answer := func(op *groupOp, res []byte, err error) {
		op.res, op.err = res, err
		close(op.done)
	}
	live := ops[:0:0]
	for _, op := range ops {
		if err := op.ctx.Err(); err != nil {
			answer(op, nil, err)
			continue
		}
		live = append(live, op)
	}
	for tries := 0; len(live) > 0; tries++ {
		if tries >= 2 || len(live) == 1 {
			// One by one (a lone operation, or a group whose operations
			// keep failing).
			for _, op := range live {
				var res []byte
				err := s.store.Update(op.ctx, func(tx kv.Txn) error {
					s.prefetchPaths(op.ctx, tx, []pathRead{{op.comps, op.req}})
					var err error
					res, err = idemRun(op.ctx, tx, op.req, op.fn)
					return err
				})
				if err == nil {
					s.group.groups.Add(1)
					s.group.grouped.Add(1)
				}
				answer(op, res, err)
			}
			return
		}
		ctx, cancel := groupContext(live)
		results := make([][]byte, len(live))
		errs := make([]error, len(live))
		failed, ferr := -1, error(nil)
		reads := make([]pathRead, len(live))
		for i, op := range live {
			reads[i] = pathRead{op.comps, op.req}
		}
		err := s.store.Update(ctx, func(tx kv.Txn) error {
			failed, ferr = -1, nil
			clear(errs)
			s.prefetchPaths(ctx, tx, reads)
			for i, op := range live {
				w := &writeCounter{Txn: tx}
				res, err := idemRun(op.ctx, w, op.req, op.fn)
				if err != nil && w.writes > 0 {
					// Its writes are in the transaction: run again without it.
					failed, ferr = i, err
					return errGroupOpFailed
				}
				results[i], errs[i] = res, err
			}
			return nil
		})
		cancel()
		if failed >= 0 && errors.Is(err, errGroupOpFailed) {
			answer(live[failed], nil, ferr)
			live = slices.Delete(live, failed, failed+1)
			continue
		}
		if err == nil {
			s.group.groups.Add(1)
			s.group.grouped.Add(int64(len(live)))
		}
		for i, op := range live {
			if err == nil && errs[i] != nil {
				answer(op, nil, errs[i])
			} else {
				answer(op, results[i], err)
			}
		}
		return
	}
}

// writeCounter counts the writes of one operation of a group: one that
// fails before writing anything leaves the transaction as it found it
// (only its reads are checked for conflicts at commit), so the group goes
// on without it.
type writeCounter struct {
	kv.Txn
	writes int
}

func (w *writeCounter) Set(key, value []byte)         { w.writes++; w.Txn.Set(key, value) }
func (w *writeCounter) Delete(key []byte)             { w.writes++; w.Txn.Delete(key) }
func (w *writeCounter) DeleteRange(begin, end []byte) { w.writes++; w.Txn.DeleteRange(begin, end) }

// groupContext lasts as long as the group's most patient operation: the
// latest deadline of ops, none if one of them has none. (Each operation's
// reads use its own context, so one that gives up fails alone.)
func groupContext(ops []*groupOp) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, op := range ops {
		d, ok := op.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(op.ctx))
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(ops[0].ctx), last)
}

// busy returns a channel closed when no create or remove is being
// committed, or nil when none is now.
func (g *grouper) busy() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.idle
}

// GroupStats reports how many group transactions committed and how many
// operations they answered (equal when nothing was grouped).
func (s *Service) GroupStats() (groups, ops int64) {
	return s.group.groups.Load(), s.group.grouped.Load()
}
