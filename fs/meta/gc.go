package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/proto"
)

// GCStats counts what one collection pass did.
type GCStats struct {
	Files    int // deleted files whose chunks were removed
	Truncs   int // truncations completed
	Deferred int // deleted files still open by a writer
	Sessions int // expired write sessions ended
	Idem     int // expired request results dropped
}

// CollectGarbage runs one pass of the collector: it ends expired write
// sessions (queuing unpublished files for removal), removes the chunks of
// queued files from every chain of their layout, then deletes their
// records and inodes, and drops request results older than IdemTTL. Every
// step is idempotent, so several servers may collect at once and a pass
// cut short by a crash is finished by the next.
func (s *Service) CollectGarbage(ctx context.Context, limit int) (GCStats, error) {
	var st GCStats
	if limit <= 0 {
		limit = 256
	}
	// Expired sessions.
	var expired []kv.KeyValue
	now := time.Now().UnixNano()
	err := s.store.View(ctx, func(tx kv.ReadTxn) error {
		expired = expired[:0]
		p := []byte(prefixSession)
		kvs, err := tx.Range(ctx, s.cursor(prefixSession), kv.PrefixEnd(p), limit)
		s.advance(prefixSession, kvs, limit)
		if err != nil {
			return err
		}
		for _, e := range kvs {
			var ss session
			if json.Unmarshal(e.Value, &ss) == nil && ss.Expires < now {
				expired = append(expired, e)
			}
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	for _, e := range expired {
		if len(e.Key) < 12 {
			continue
		}
		s.yield(ctx)
		inode := beUint64(e.Key[4:12])
		sid := string(e.Key[12:])
		err := s.store.Update(ctx, func(tx kv.Txn) error {
			var ss session
			ok, err := getJSON(ctx, tx, e.Key, &ss)
			if err != nil || !ok || ss.Expires >= now {
				return err // renewed or gone meanwhile
			}
			tx.Delete(e.Key)
			n, err := getInode(ctx, tx, inode)
			if errors.Is(err, iofs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if n.Parent == 0 {
				return s.maybeCollectUnlinked(ctx, tx, n, sid)
			}
			return nil
		})
		if err != nil {
			return st, err
		}
		st.Sessions++
	}

	// Queued files.
	var recs []gcRecord
	err = s.store.View(ctx, func(tx kv.ReadTxn) error {
		recs = recs[:0]
		p := []byte(prefixGC)
		kvs, err := tx.Range(ctx, s.cursor(prefixGC), kv.PrefixEnd(p), limit)
		s.advance(prefixGC, kvs, limit)
		if err != nil {
			return err
		}
		for _, e := range kvs {
			var r gcRecord
			if err := json.Unmarshal(e.Value, &r); err != nil {
				return fmt.Errorf("meta: corrupt GC record %q: %w", e.Key, err)
			}
			recs = append(recs, r)
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	for i := range recs {
		r := &recs[i]
		s.yield(ctx)
		// A truncation's own call collects its record before it returns;
		// the collector takes over only records left by a server that died
		// first. Collecting a young one here could cut a chunk after the
		// truncating call returned and its client wrote new bytes into it.
		if !r.Delete && nowNano()-r.Queued < int64(truncateGrace) {
			st.Deferred++
			continue
		}
		if !r.Delete {
			// Still queued as read? The truncation's own collect may have
			// done it since, and new bytes may have been written after it:
			// cutting the chunks again would lose them.
			var cur gcRecord
			var ok bool
			err := s.store.View(ctx, func(tx kv.ReadTxn) error {
				var err error
				ok, err = getJSON(ctx, tx, gcKey(r.Inode), &cur)
				return err
			})
			if err != nil {
				return st, err
			}
			if !ok || cur.Queued != r.Queued {
				continue
			}
		}
		if r.Delete {
			busy, err := s.hasSessions(ctx, r.Inode)
			if err != nil {
				return st, err
			}
			if busy {
				st.Deferred++
				continue
			}
		}
		if err := s.collect(ctx, r); err != nil {
			return st, err
		}
		if r.Delete {
			st.Files++
		} else {
			st.Truncs++
		}
	}

	// Old request results.
	cut := time.Now().Add(-s.opts.IdemTTL).UnixNano()
	err = s.store.Update(ctx, func(tx kv.Txn) error {
		st.Idem = 0
		p := []byte(prefixIdem)
		kvs, err := tx.SnapshotRange(ctx, s.cursor(prefixIdem), kv.PrefixEnd(p), limit)
		s.advance(prefixIdem, kvs, limit)
		if err != nil {
			return err
		}
		for _, e := range kvs {
			var r idem
			if json.Unmarshal(e.Value, &r) == nil && r.At < cut {
				tx.Delete(e.Key)
				st.Idem++
			}
		}
		return nil
	})
	return st, err
}

func (s *Service) hasSessions(ctx context.Context, inode uint64) (bool, error) {
	var busy bool
	err := s.store.View(ctx, func(tx kv.ReadTxn) error {
		p := sessionPrefix(inode)
		kvs, err := tx.Range(ctx, p, kv.PrefixEnd(p), 1)
		busy = len(kvs) > 0
		return err
	})
	return busy, err
}

// truncateGrace is how old a truncation's GC record must be before the
// collector takes it (the truncating call collects it itself at once).
const truncateGrace = 30 * time.Second

// collect removes the chunks a GC record names, then the record (and, for
// a deleted file, its inode and sessions) in one transaction.
func (s *Service) collect(ctx context.Context, r *gcRecord) error {
	if s.opts.Chunks == nil {
		return fmt.Errorf("meta: cannot collect inode %d: no data plane configured", r.Inode)
	}
	l := r.Layout
	if len(l.Chains) == 0 || l.ChunkSize <= 0 {
		return fmt.Errorf("meta: GC record of inode %d has an empty layout", r.Inode)
	}
	if !r.Delete && r.Size%l.ChunkSize != 0 {
		idx := uint64(r.Size / l.ChunkSize)
		if err := s.opts.Chunks.TruncateChunk(ctx, l.Chain(idx), proto.ChunkID{Inode: r.Inode, Index: idx}, r.Size%l.ChunkSize); err != nil {
			return fmt.Errorf("meta: truncate chunk %d of inode %d: %w", idx, r.Inode, err)
		}
	}
	seen := map[proto.ChainID]bool{}
	for _, c := range l.Chains {
		if seen[c] {
			continue
		}
		seen[c] = true
		if err := s.opts.Chunks.RemoveChunks(ctx, c, r.Inode, r.FromIndex); err != nil {
			return fmt.Errorf("meta: remove chunks of inode %d on chain %d: %w", r.Inode, c, err)
		}
	}
	return s.store.Update(ctx, func(tx kv.Txn) error {
		var cur gcRecord
		ok, err := getJSON(ctx, tx, gcKey(r.Inode), &cur)
		if err != nil || !ok {
			return err
		}
		if cur.Queued != r.Queued {
			return nil // re-queued meanwhile (a later truncate): its own pass handles it
		}
		tx.Delete(gcKey(r.Inode))
		if r.Delete {
			n, err := getInode(ctx, tx, r.Inode)
			if err == nil && n.Parent == 0 {
				tx.Delete(inodeKey(r.Inode))
				p := sessionPrefix(r.Inode)
				tx.DeleteRange(p, kv.PrefixEnd(p))
			}
		}
		return nil
	})
}

// gcYieldMax bounds how long the collector waits, per file, for the
// creates and removes in flight on this server to be answered: it yields
// to them (a create loop at 545/s fell to 32/s while the collector removed
// 20,000 files beside it, both sharing the store's commits), yet it still
// makes progress under a steady stream of them (at least one file per
// gcYieldMax, 50/s).
const gcYieldMax = 20 * time.Millisecond

// yield waits until no foreground create or remove is in flight on this
// server, for at most s.gcYieldMax (default gcYieldMax).
func (s *Service) yield(ctx context.Context) {
	ch := s.group.busy()
	if ch == nil {
		return
	}
	s.gcYields.Add(1)
	d := s.gcYieldMax
	if d <= 0 {
		d = gcYieldMax
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// cursor is where the collector's next scan of a key range starts: each
// pass reads at most limit keys and the next pass goes on after them,
// wrapping at the end, so a range larger than limit (many live sessions,
// deferred files, young request results at its start) is still covered.
func (s *Service) cursor(prefix string) []byte {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	if c, ok := s.gcCursor[prefix]; ok {
		return c
	}
	return []byte(prefix)
}

// advance moves the cursor past a scan that returned kvs.
func (s *Service) advance(prefix string, kvs []kv.KeyValue, limit int) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	if s.gcCursor == nil {
		s.gcCursor = map[string][]byte{}
	}
	if len(kvs) < limit {
		delete(s.gcCursor, prefix) // reached the end: start over next time
		return
	}
	s.gcCursor[prefix] = append(append([]byte(nil), kvs[len(kvs)-1].Key...), 0)
}
