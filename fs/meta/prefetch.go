package meta

import (
	"context"
	"sync"

	"github.com/ffkit/ffkit/fs/kv"
)

// Prefetching. An operation on a path reads, one after another, the entry
// of each component from the root, its parent directory's inode, and the
// inode its last component names: on etcd each read is a round trip, and
// a group of creates (group.go) ran them all in turn (two to five per
// operation), so reads, not commits, bounded the group. Before the
// closures run, prefetchPaths reads what they will read for all the
// operations of a transaction at once, level by level, with one
// kv.Prefetcher call per level; the closures then find every value in
// the transaction's read cache. Guesses of directories' inode ids (from
// earlier walks) let one call read a whole path: a wrong or stale guess
// (files' ids too: the last level) costs only a wasted read and another level, never a wrong answer, since
// every value is read from the transaction's own snapshot and the
// closures check what they read as before.

// pathRead is what one operation will read: the entries along comps, its
// parent's inode, the inode its last entry names, and its request's
// idempotency record (req "": none).
type pathRead struct {
	comps []string
	req   string
}

// maxDirGuesses bounds the guess cache (about 100 bytes an entry); when
// it is full it starts afresh.
const maxDirGuesses = 1 << 16

// dirGuesses maps a directory entry's key to the inode id it names, as
// last read or created. Only a hint (see above).
type dirGuesses struct {
	mu sync.Mutex
	m  map[string]uint64 // guarded by mu
}

func (g *dirGuesses) get(k []byte) (uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id, ok := g.m[string(k)]
	return id, ok
}

func (g *dirGuesses) put(k []byte, id uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.m[string(k)]; ok && old == id {
		return
	}
	if g.m == nil || len(g.m) >= maxDirGuesses {
		g.m = map[string]uint64{}
	}
	g.m[string(k)] = id
}

func (g *dirGuesses) drop(k []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, string(k))
}

// maxPrefetchRounds bounds the levels read (deeper paths read the rest
// one at a time, as without prefetching).
const maxPrefetchRounds = 16

// prefetchPaths reads what reads will read (see above) into r's read
// cache, when r is a kv.Prefetcher. Errors are dropped: the operations'
// own reads meet them again and report them.
func (s *Service) prefetchPaths(ctx context.Context, r kv.ReadTxn, reads []pathRead) {
	pf, ok := r.(kv.Prefetcher)
	if !ok || len(reads) == 0 {
		return
	}
	type walkState struct {
		cur    uint64 // inode id the first i components name
		i      int
		parent uint64 // the parent directory's id once i >= len(comps)-1
		done   bool
	}
	type value struct {
		val []byte
		ok  bool
	}
	known := map[string]value{}
	st := make([]walkState, len(reads))
	for i := range st {
		st[i].cur = RootInode
		st[i].done = len(reads[i].comps) == 0
	}
	for round := 0; round < maxPrefetchRounds; round++ {
		var keys [][]byte
		added := map[string]bool{}
		want := func(k []byte) {
			if _, have := known[string(k)]; !have && !added[string(k)] {
				added[string(k)] = true
				keys = append(keys, k)
			}
		}
		for i, rd := range reads {
			w := &st[i]
			if round == 0 && rd.req != "" {
				want(idemKey(rd.req))
			}
			if w.done {
				continue
			}
			last := len(rd.comps) - 1
			// Go down as far as the values read so far lead.
			for w.i <= last {
				if w.i == last {
					w.parent = w.cur
				}
				k := dentryKey(w.cur, rd.comps[w.i])
				v, have := known[string(k)]
				if !have {
					break
				}
				if !v.ok {
					s.guesses.drop(k)
					w.done = true // missing: the operation needs no more
					break
				}
				de, err := decodeDentry(v.val)
				if err != nil {
					w.done = true
					break
				}
				s.guesses.put(k, de.Inode)
				if w.i < last && !de.IsDir {
					w.done = true
					break
				}
				w.cur = de.Inode
				w.i++
			}
			pending := false
			need := func(k []byte) {
				if _, have := known[string(k)]; !have {
					pending = true
					want(k)
				}
			}
			if w.i >= last && w.parent != 0 {
				need(inodeKey(w.parent))
			}
			if !w.done {
				if w.i > last {
					need(inodeKey(w.cur)) // the inode the path names
				} else {
					need(dentryKey(w.cur, rd.comps[w.i]))
					// Guess the rest of the way.
					g := w.cur
					for j := w.i; j <= last; j++ {
						id, ok := s.guesses.get(dentryKey(g, rd.comps[j]))
						if !ok {
							break
						}
						if j >= last-1 {
							want(inodeKey(id)) // the parent's or the named inode
						}
						if j < last {
							want(dentryKey(id, rd.comps[j+1]))
						}
						g = id
					}
				}
			}
			if !pending {
				w.done = true // everything it reads is known
			}
		}
		if len(keys) == 0 {
			return
		}
		vals, oks, err := pf.Prefetch(ctx, keys)
		if err != nil {
			return
		}
		for i, k := range keys {
			known[string(k)] = value{vals[i], oks[i]}
		}
	}
}
