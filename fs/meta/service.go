package meta

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/proto"
)

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// Store holds all metadata. Required.
	Store kv.Store
	// Chunks is the data plane: the chain table for layouts and chunk
	// removal for GC. Required for creating files and for GC.
	Chunks Chunks
	// Stripe is how many chains a new file's chunks rotate over (capped
	// at the chain table's size). Default 8.
	Stripe int
	// ChunkSize of new files. Default: Chunks.ChunkSize().
	ChunkSize int64
	// SessionTTL: a write session not renewed for this long has ended.
	// Default 60 s.
	SessionTTL time.Duration
	// IdemTTL: how long a request's stored result is kept. Default 30 min.
	IdemTTL time.Duration
	// ListLayouts: a listing of at most this many entries also reads the
	// inodes of its owned files, for their layouts (Entry.Layout), so a
	// mount opens them with no Stat; a larger listing is one range read
	// (an inode read per entry made listing a 5,000-entry directory cost
	// 5,000 reads). Default 256; negative: never.
	ListLayouts int
}

// Service is the metadata logic over a kv.Store. It keeps no state of its
// own beyond a block of pre-allocated inode ids (and hints, prefetch.go),
// so any number of Services (one per metadata server) work on one store
// at once. Safe for concurrent use.
type Service struct {
	opts  Options
	store kv.Store

	idMu   sync.Mutex
	nextID uint64 // guarded by idMu: next id of the allocated block
	endID  uint64 // guarded by idMu: end of the block (exclusive)

	gcMu     sync.Mutex
	gcCursor map[string][]byte // guarded by gcMu: where the collector's scans resume

	group   grouper    // creates and removes committed together (group.go)
	guesses dirGuesses // directories' inode ids, a hint for prefetching (prefetch.go)

	gcYields   atomic.Int64  // times the collector waited for foreground operations
	gcYieldMax time.Duration // 0: gcYieldMax (tests set it longer)
}

// NewService returns a Service and makes sure the root directory exists.
func NewService(ctx context.Context, opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("meta: a kv store is required")
	}
	if opts.Stripe <= 0 {
		opts.Stripe = 8
	}
	if opts.ListLayouts == 0 {
		opts.ListLayouts = 256
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = 60 * time.Second
	}
	if opts.IdemTTL <= 0 {
		opts.IdemTTL = 30 * time.Minute
	}
	s := &Service{opts: opts, store: opts.Store}
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		_, ok, err := tx.Get(ctx, inodeKey(RootInode))
		if err != nil || ok {
			return err
		}
		now := nowNano()
		putInode(tx, &Inode{ID: RootInode, Type: TypeDir, Parent: RootInode, Nlink: 2, MTime: now, ATime: now, CTime: now})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("meta: create root: %w", err)
	}
	return s, nil
}

const idBlock = 1024

// allocID returns a fresh inode id, taking a block of ids from the store
// when the local block is used up (ids lost in a crash are never reused).
func (s *Service) allocID(ctx context.Context) (uint64, error) {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	if s.nextID < s.endID {
		s.nextID++
		return s.nextID - 1, nil
	}
	var start uint64
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		v, ok, err := tx.Get(ctx, []byte(keyInodeAlloc))
		if err != nil {
			return err
		}
		start = RootInode + 1
		if ok && len(v) == 8 {
			start = binary.BigEndian.Uint64(v)
		}
		tx.Set([]byte(keyInodeAlloc), binary.BigEndian.AppendUint64(nil, start+idBlock))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("meta: allocate inode ids: %w", err)
	}
	s.nextID, s.endID = start+1, start+idBlock
	return start, nil
}

func (s *Service) newLayout() (*Layout, error) {
	if s.opts.Chunks == nil {
		return nil, merr(ErrNoChains, "meta: no data plane configured")
	}
	chains := s.opts.Chunks.Chains()
	if len(chains) == 0 {
		return nil, merr(ErrNoChains, "meta: new file")
	}
	cs := s.opts.ChunkSize
	if cs <= 0 {
		cs = s.opts.Chunks.ChunkSize()
	}
	if cs <= 0 {
		cs = proto.DefaultChunkSize
	}
	n := min(s.opts.Stripe, len(chains))
	base := rand.IntN(len(chains))
	l := &Layout{ChunkSize: cs}
	for i := 0; i < n; i++ {
		l.Chains = append(l.Chains, chains[(base+i)%len(chains)])
	}
	return l, nil
}

// --- small helpers over a transaction ---

type reader interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
}

type snap struct{ tx kv.Txn }

func (r snap) Get(ctx context.Context, k []byte) ([]byte, bool, error) {
	return r.tx.SnapshotGet(ctx, k)
}

func getJSON(ctx context.Context, r reader, key []byte, v any) (bool, error) {
	b, ok, err := r.Get(ctx, key)
	if err != nil || !ok {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("meta: corrupt value under %q: %w", key, err)
	}
	return true, nil
}

func setJSON(tx kv.Txn, key []byte, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own plain structs always marshal
	}
	tx.Set(key, b)
}

func getInode(ctx context.Context, r reader, id uint64) (*Inode, error) {
	var n Inode
	ok, err := getJSON(ctx, r, inodeKey(id), &n)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, merr(iofs.ErrNotExist, "meta: inode %d", id)
	}
	return &n, nil
}

func putInode(tx kv.Txn, n *Inode) { setJSON(tx, inodeKey(n.ID), n) }

func dentryOf(n *Inode) Dentry {
	return Dentry{Inode: n.ID, IsDir: n.IsDir(), Type: n.Type, Size: n.Size, MTime: n.MTime, Owned: n.Owned,
		Shared: !n.IsDir() && n.Nlink > 1, Perm: n.Perm, Uid: n.Uid, Gid: n.Gid, hasOwner: n.Owned}
}

// newInode is a fresh inode of type t with all three times now and the
// owner o (nil: none stored, the mount's defaults apply). In a parent
// directory with the setgid bit, it takes the directory's group, and a
// new directory keeps the bit (as Linux does).
func newInode(id uint64, t Type, parent *Inode, name string, o *fs.Owner) *Inode {
	now := nowNano()
	n := &Inode{ID: id, Type: t, Parent: parent.ID, Name: name, Nlink: 1, MTime: now, ATime: now, CTime: now}
	if t == TypeDir {
		n.Nlink = 2
	}
	if o != nil {
		n.Owned, n.Perm, n.Uid, n.Gid = true, o.Perm&0o7777, o.Uid, o.Gid
		if parent.Owned && parent.Perm&0o2000 != 0 {
			n.Gid = parent.Gid
			if t == TypeDir {
				n.Perm |= 0o2000
			}
		}
	}
	return n
}

func putDentry(tx kv.Txn, parent uint64, name string, n *Inode) {
	tx.Set(dentryKey(parent, name), encodeDentry(dentryOf(n)))
}

// touchDir records that an entry of directory dir changed now (its mtime
// and ctime), with a blind write: concurrent creates in one directory do
// not conflict on it.
func touchDir(tx kv.Txn, dir uint64) {
	now := uint64(nowNano())
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 16), now)
	tx.Set(dirTimeKey(dir), binary.BigEndian.AppendUint64(b, now))
}

// addSubdirs changes directory dir's link count by delta subdirectories
// (2 + its subdirectories, as Linux file systems count). The read is
// conflict-checked, so concurrent mkdirs in one directory serialize on it.
// A count stored before subdirectories were counted never drops below 2.
func addSubdirs(ctx context.Context, tx kv.Txn, dir uint64, delta int) error {
	if delta == 0 {
		return nil
	}
	p, err := getInode(ctx, tx, dir)
	if err != nil {
		return err
	}
	p.Nlink = max(p.Nlink+delta, 2)
	putInode(tx, p)
	return nil
}

// withDirTimes applies directory n's last entry change (DTIM) to its
// times: mtime when the change is newer than n's own last change (a
// utimensat after it wins), ctime when newer.
func withDirTimes(ctx context.Context, r reader, n *Inode) error {
	if !n.IsDir() {
		return nil
	}
	b, ok, err := r.Get(ctx, dirTimeKey(n.ID))
	if err != nil || !ok || len(b) != 16 {
		return err
	}
	m, c := int64(binary.BigEndian.Uint64(b[:8])), int64(binary.BigEndian.Uint64(b[8:]))
	if m > n.CTime {
		n.MTime = m
	}
	n.CTime = max(n.CTime, c)
	return nil
}

func getDentry(ctx context.Context, r reader, key []byte, d *Dentry) (bool, error) {
	b, ok, err := r.Get(ctx, key)
	if err != nil || !ok {
		return false, err
	}
	if *d, err = decodeDentry(b); err != nil {
		return false, fmt.Errorf("meta: entry %q: %w", key, err)
	}
	return true, nil
}

// walk resolves comps from the root with snapshot reads and returns the
// inode id each names; every component but the last must be a directory.
func walk(ctx context.Context, r reader, path string, comps []string) (uint64, *Dentry, error) {
	cur := RootInode
	var d *Dentry
	for i, c := range comps {
		var de Dentry
		ok, err := getDentry(ctx, r, dentryKey(cur, c), &de)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			return 0, nil, merr(iofs.ErrNotExist, "meta: %s", path)
		}
		if i < len(comps)-1 && !de.IsDir {
			return 0, nil, merr(ErrNotDir, "meta: %s: %s", path, c)
		}
		cur, d = de.Inode, &de
	}
	return cur, d, nil
}

// parentDir resolves the directory holding the last component of path and
// reads its inode with a conflict-checked Get (a concurrent rmdir conflicts).
// lookupEntry finds the directory entry that path (split into comps) names:
// its parent directory's inode, its name and the entry. A missing entry is
// ErrNotExist naming op and path.
func lookupEntry(ctx context.Context, tx kv.Txn, op, path string, comps []string) (pid uint64, name string, de Dentry, err error) {
	pid, err = parentDir(ctx, tx, path, comps)
	if err != nil {
		return 0, "", de, err
	}
	name = comps[len(comps)-1]
	ok, err := getDentry(ctx, tx, dentryKey(pid, name), &de)
	if err != nil {
		return 0, "", de, err
	}
	if !ok {
		return 0, "", de, merr(iofs.ErrNotExist, "meta: %s %s", op, path)
	}
	return pid, name, de, nil
}

func parentDir(ctx context.Context, tx kv.Txn, path string, comps []string) (uint64, error) {
	p, err := parentInode(ctx, tx, path, comps)
	if err != nil {
		return 0, err
	}
	return p.ID, nil
}

// parentInode is parentDir returning the directory's inode.
func parentInode(ctx context.Context, tx kv.Txn, path string, comps []string) (*Inode, error) {
	pid, _, err := walk(ctx, snap{tx}, path, comps[:len(comps)-1])
	if err != nil {
		return nil, err
	}
	p, err := getInode(ctx, tx, pid)
	if err != nil {
		return nil, merr(iofs.ErrNotExist, "meta: %s: parent directory", path)
	}
	if !p.IsDir() {
		return nil, merr(ErrNotDir, "meta: %s: parent", path)
	}
	return p, nil
}

// withIdem runs fn in a transaction that stores fn's result under the
// request id, or returns the stored result of an earlier run of the same
// request.
func (s *Service) withIdem(ctx context.Context, req string, fn func(tx kv.Txn) (any, error), out any) error {
	var res []byte
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		var err error
		res, err = idemRun(ctx, tx, req, fn)
		return err
	})
	if err != nil {
		return err
	}
	if out != nil && len(res) > 0 {
		return json.Unmarshal(res, out)
	}
	return nil
}

// idemRun runs fn in tx unless request req already stored its result, and
// stores fn's result under req; it returns the result (JSON).
func idemRun(ctx context.Context, tx kv.Txn, req string, fn func(tx kv.Txn) (any, error)) ([]byte, error) {
	if req != "" {
		var rec idem
		ok, err := getJSON(ctx, tx, idemKey(req), &rec)
		if err != nil {
			return nil, err
		}
		if ok {
			return rec.Result, nil
		}
	}
	v, err := fn(tx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if req != "" {
		setJSON(tx, idemKey(req), idem{Result: b, At: nowNano()})
	}
	return b, nil
}

// --- read operations ---

// Stat returns the inode at path.
func (s *Service) Stat(ctx context.Context, path string) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	var n *Inode
	err = s.store.View(ctx, func(tx kv.ReadTxn) error {
		s.prefetchPaths(ctx, tx, []pathRead{{comps: comps}})
		id, _, err := walk(ctx, tx, path, comps)
		if err != nil {
			return err
		}
		if n, err = getInode(ctx, tx, id); err != nil {
			return err
		}
		return withDirTimes(ctx, tx, n)
	})
	return n, err
}

// StatInode returns inode id.
func (s *Service) StatInode(ctx context.Context, id uint64) (*Inode, error) {
	var n *Inode
	err := s.store.View(ctx, func(tx kv.ReadTxn) error {
		var err error
		if n, err = getInode(ctx, tx, id); err != nil {
			return err
		}
		return withDirTimes(ctx, tx, n)
	})
	return n, err
}

// Readdir lists the directory at path in name order.
func (s *Service) Readdir(ctx context.Context, path string) ([]Entry, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	var out []Entry
	err = s.store.View(ctx, func(tx kv.ReadTxn) error {
		out = nil
		s.prefetchPaths(ctx, tx, []pathRead{{comps: comps}})
		id, d, err := walk(ctx, tx, path, comps)
		if err != nil {
			return err
		}
		if d != nil && !d.IsDir {
			return merr(ErrNotDir, "meta: %s", path)
		}
		p := dentryPrefix(id)
		kvs, err := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
		if err != nil {
			return err
		}
		if pf, ok := tx.(kv.Prefetcher); ok {
			// The inodes read below, in one round trip.
			var keys [][]byte
			for _, e := range kvs {
				if de, err := decodeDentry(e.Value); err == nil && listReadsInode(de, len(kvs), s.opts.ListLayouts) {
					keys = append(keys, inodeKey(de.Inode))
				}
			}
			if len(keys) > 0 {
				pf.Prefetch(ctx, keys) // errors: met again below
			}
		}
		for _, e := range kvs {
			name, err := dentryName(e.Key)
			if err != nil {
				return err
			}
			de, err := decodeDentry(e.Value)
			if err != nil {
				return fmt.Errorf("meta: corrupt entry %q in %s: %w", name, path, err)
			}
			ent := Entry{Name: name, Dentry: de}
			if listReadsInode(de, len(kvs), s.opts.ListLayouts) {
				// An entry without a copy of the owner (written before
				// copies were kept), or one of several names of a file
				// (another name's chmod does not update it), costs an
				// inode read; the others are described by the entry,
				// except for the layouts of a small directory's files.
				n, err := getInode(ctx, tx, de.Inode)
				if err != nil {
					return fmt.Errorf("meta: entry %q in %s: %w", name, path, err)
				}
				ent.Owned, ent.Perm, ent.Uid, ent.Gid = n.Owned, n.Perm, n.Uid, n.Gid
				ent.Size, ent.MTime = n.Size, n.MTime
				if n.Type == TypeFile && n.Layout != nil {
					ent.Layout, ent.Holes = n.Layout, n.Holes
				}
			}
			out = append(out, ent)
		}
		return nil
	})
	return out, err
}

// listReadsInode says whether a listing of n entries reads the inode of
// entry de (see Readdir).
func listReadsInode(de Dentry, n, listLayouts int) bool {
	stale := (de.Owned && !de.hasOwner) || de.Shared
	layouts := de.Owned && !de.IsDir && n <= listLayouts
	return stale || layouts
}

// --- namespace operations (idempotent under a request id) ---

// Mkdir creates the directory at path; with parents, missing parents too,
// and an existing directory is not an error.
//
// The last directory gets owner o (nil: none stored); missing parents get none.
func (s *Service) Mkdir(ctx context.Context, req, path string, parents bool, o *fs.Owner) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	if len(comps) == 0 {
		if parents {
			return s.Stat(ctx, "/")
		}
		return nil, merr(iofs.ErrExist, "meta: /")
	}
	// Ids are taken before the transaction, which may run more than once.
	ids := make([]uint64, len(comps))
	for i := range ids {
		if ids[i], err = s.allocID(ctx); err != nil {
			return nil, err
		}
	}
	var out Inode
	err = s.withIdem(ctx, req, func(tx kv.Txn) (any, error) {
		cur := RootInode
		var last *Inode
		for i, c := range comps {
			var de Dentry
			ok, err := getDentry(ctx, snap{tx}, dentryKey(cur, c), &de)
			if err != nil {
				return nil, err
			}
			if ok {
				if i == len(comps)-1 && (!parents || !de.IsDir) {
					return nil, merr(iofs.ErrExist, "meta: mkdir %s", path)
				}
				if !de.IsDir {
					return nil, merr(ErrNotDir, "meta: mkdir %s: %s", path, c)
				}
				cur = de.Inode
				if i == len(comps)-1 {
					return getInode(ctx, tx, cur)
				}
				continue
			}
			if i < len(comps)-1 && !parents {
				return nil, merr(iofs.ErrNotExist, "meta: mkdir %s: parent %s", path, c)
			}
			// Create c in cur: the parent must still exist, the name be free.
			parent, err := getInode(ctx, tx, cur)
			if err != nil {
				return nil, merr(iofs.ErrNotExist, "meta: mkdir %s: parent", path)
			}
			if _, ok, err := tx.Get(ctx, dentryKey(cur, c)); err != nil || ok {
				if err == nil {
					err = merr(iofs.ErrExist, "meta: mkdir %s", path)
				}
				return nil, err
			}
			var owner *fs.Owner
			if i == len(comps)-1 {
				owner = o
			}
			n := newInode(ids[i], TypeDir, parent, c, owner)
			parent.Nlink = max(parent.Nlink+1, 3)
			putInode(tx, parent)
			putInode(tx, n)
			putDentry(tx, cur, c, n)
			touchDir(tx, cur)
			cur, last = n.ID, n
		}
		return last, nil
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Create creates an empty file at path with a new layout. With exclusive,
// an existing file is an error (of two exclusive creates of one name,
// exactly one succeeds); without, the existing file is returned.
// A new file gets owner o (nil: none stored).
func (s *Service) Create(ctx context.Context, req, path string, exclusive bool, o *fs.Owner) (*Inode, error) {
	n, _, err := s.create(ctx, req, path, exclusive, o, "")
	return n, err
}

// openResult is what a create that opens a write session stores under
// its request id.
type openResult struct {
	Inode   *Inode `json:"inode"`
	Session string `json:"session,omitempty"`
}

// create is Create; with client set it also opens a write session for it
// on the file (marked as possibly having holes, see OpenWrite) in the same
// transaction: one durable commit for open(O_CREAT) instead of two.
func (s *Service) create(ctx context.Context, req, path string, exclusive bool, o *fs.Owner, client string) (*Inode, string, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, "", err
	}
	if len(comps) == 0 {
		return nil, "", merr(ErrIsDir, "meta: create /")
	}
	id, err := s.allocID(ctx)
	if err != nil {
		return nil, "", err
	}
	layout, err := s.newLayout()
	if err != nil {
		return nil, "", err
	}
	sid := ""
	if client != "" {
		sid = newSessionID()
	}
	var out openResult
	var plain Inode
	var result any = &out
	if sid == "" {
		result = &plain
	}
	var named []byte // the entry's key, a guess for later walks (prefetch.go)
	err = s.withIdemGrouped(ctx, req, comps, func(tx kv.Txn) (any, error) {
		named = nil
		parent, err := parentInode(ctx, tx, path, comps)
		if err != nil {
			return nil, err
		}
		pid := parent.ID
		name := comps[len(comps)-1]
		named = dentryKey(pid, name)
		var de Dentry
		ok, err := getDentry(ctx, tx, dentryKey(pid, name), &de)
		if err != nil {
			return nil, err
		}
		var n *Inode
		if ok {
			if de.IsDir {
				return nil, merr(ErrIsDir, "meta: create %s", path)
			}
			if exclusive {
				return nil, merr(iofs.ErrExist, "meta: create %s", path)
			}
			if n, err = getInode(ctx, tx, de.Inode); err != nil {
				return nil, err
			}
			if n.Type != TypeFile {
				return nil, merr(ErrInvalid, "meta: create %s: not a regular file", path)
			}
			if sid != "" && !n.Holes {
				n.Holes = true
				putInode(tx, n)
			}
		} else {
			n = newInode(id, TypeFile, parent, name, o)
			n.Layout = layout
			n.Holes = sid != ""
			putInode(tx, n)
			putDentry(tx, pid, name, n)
			touchDir(tx, pid)
		}
		if sid != "" {
			setJSON(tx, sessionKey(n.ID, sid), session{Client: client, Expires: time.Now().Add(s.opts.SessionTTL).UnixNano()})
		}
		if sid == "" {
			return n, nil // as stored before sessions were opened here
		}
		return openResult{Inode: n, Session: sid}, nil
	}, result)
	if err != nil {
		return nil, "", err
	}
	made := &plain
	if sid != "" {
		made = out.Inode
	}
	if made != nil && made.ID != 0 && named != nil {
		s.guesses.put(named, made.ID)
	}
	if sid == "" {
		return &plain, "", nil
	}
	if out.Inode == nil {
		return nil, "", fmt.Errorf("meta: create %s: request %s stored no inode", path, req)
	}
	return out.Inode, out.Session, nil
}

// unlinkFileLocked detaches file inode n (already read conflict-checked)
// from the namespace and queues its chunks for collection.
//
// A published file (named until now) never opened for writing at offsets
// (no holes) with length 0 has no chunks: every chunk of a file published
// whole is inside its length, and a create without a write session writes
// none. It needs no collection (which costs a chunk removal per chain and
// a transaction). An unpublished one may have chunks of a writer that died.
func unlinkFile(tx kv.Txn, n *Inode, published bool) {
	empty := published && n.Size == 0 && !n.Holes
	n.Parent, n.Name, n.Nlink = 0, "", 0
	putInode(tx, n)
	if n.Layout != nil && !empty {
		setJSON(tx, gcKey(n.ID), gcRecord{Inode: n.ID, Layout: *n.Layout, Delete: true, Queued: nowNano()})
	} else {
		tx.Delete(inodeKey(n.ID))
	}
}

// dropName removes the name (pid, name) of non-directory n (read
// conflict-checked): the last name unlinks it, an earlier one of several
// hard links only counts it down.
func dropName(tx kv.Txn, n *Inode, pid uint64, name string) {
	tx.Delete(dentryKey(pid, name))
	if n.Nlink > 1 {
		n.Nlink--
		n.CTime = nowNano()
		if n.Parent == pid && n.Name == name {
			n.Name = ""
		}
		putInode(tx, n)
		return
	}
	unlinkFile(tx, n, true)
}

// Remove removes the file or empty directory at path.
func (s *Service) Remove(ctx context.Context, req, path string) error {
	comps, err := splitPath(path)
	if err != nil {
		return err
	}
	if len(comps) == 0 {
		return merr(ErrInvalid, "meta: remove /")
	}
	return s.withIdemGrouped(ctx, req, comps, func(tx kv.Txn) (any, error) {
		pid, name, de, err := lookupEntry(ctx, tx, "remove", path, comps)
		if err != nil {
			return nil, err
		}
		n, err := getInode(ctx, tx, de.Inode)
		if err != nil {
			return nil, err
		}
		tx.Delete(dentryKey(pid, name))
		touchDir(tx, pid)
		if n.IsDir() {
			p := dentryPrefix(n.ID)
			kids, err := tx.Range(ctx, p, kv.PrefixEnd(p), 1)
			if err != nil {
				return nil, err
			}
			if len(kids) > 0 {
				return nil, merr(ErrNotEmpty, "meta: remove %s", path)
			}
			tx.Delete(inodeKey(n.ID))
			tx.Delete(dirTimeKey(n.ID))
			return true, addSubdirs(ctx, tx, pid, -1)
		}
		dropName(tx, n, pid, name)
		return true, nil
	}, nil)
}

// Rename moves src to dst atomically. An existing file at dst is replaced
// (its chunks collected); an existing empty directory is replaced by a
// directory. A directory cannot move under itself: of two concurrent
// renames that would together make a cycle, one fails with ErrInvalid.
//
// flags are renameat2's: fs.RenameNoReplace fails with ErrExist when dst
// exists; fs.RenameExchange swaps src and dst (both must exist).
func (s *Service) Rename(ctx context.Context, req, src, dst string, flags uint32) error {
	sc, err := splitPath(src)
	if err != nil {
		return err
	}
	dc, err := splitPath(dst)
	if err != nil {
		return err
	}
	if len(sc) == 0 || len(dc) == 0 {
		return merr(ErrInvalid, "meta: rename %s to %s: the root cannot move or be replaced", src, dst)
	}
	return s.withIdem(ctx, req, func(tx kv.Txn) (any, error) {
		sp, sname, sde, err := lookupEntry(ctx, tx, "rename", src, sc)
		if err != nil {
			return nil, err
		}
		dp, err := parentDir(ctx, tx, dst, dc)
		if err != nil {
			return nil, err
		}
		dname := dc[len(dc)-1]
		n, err := getInode(ctx, tx, sde.Inode)
		if err != nil {
			return nil, err
		}
		if n.IsDir() {
			if err := notUnder(ctx, tx, n.ID, dp, src, dst); err != nil {
				return nil, err
			}
		}
		var dde Dentry
		ok, err := getDentry(ctx, tx, dentryKey(dp, dname), &dde)
		if err != nil {
			return nil, err
		}
		if flags&fs.RenameExchange != 0 {
			if !ok {
				return nil, merr(iofs.ErrNotExist, "meta: rename %s to %s (exchange)", src, dst)
			}
			if dde.Inode == n.ID {
				return true, nil
			}
			old, err := getInode(ctx, tx, dde.Inode)
			if err != nil {
				return nil, err
			}
			if old.IsDir() {
				if err := notUnder(ctx, tx, old.ID, sp, dst, src); err != nil {
					return nil, err
				}
			}
			now := nowNano()
			n.Parent, n.Name, n.CTime = dp, dname, now
			old.Parent, old.Name, old.CTime = sp, sname, now
			putInode(tx, n)
			putInode(tx, old)
			putDentry(tx, dp, dname, n)
			putDentry(tx, sp, sname, old)
			touchDir(tx, sp)
			touchDir(tx, dp)
			if sp != dp && n.IsDir() != old.IsDir() {
				d := 1 // a directory moves from sp to dp
				if old.IsDir() {
					d = -1
				}
				if err := addSubdirs(ctx, tx, sp, -d); err != nil {
					return nil, err
				}
				if err := addSubdirs(ctx, tx, dp, d); err != nil {
					return nil, err
				}
			}
			return true, nil
		}
		replacedDir := false
		if ok {
			if flags&fs.RenameNoReplace != 0 {
				return nil, merr(iofs.ErrExist, "meta: rename %s to %s", src, dst)
			}
			if dde.Inode == n.ID {
				return true, nil // same file: nothing to do
			}
			old, err := getInode(ctx, tx, dde.Inode)
			if err != nil {
				return nil, err
			}
			switch {
			case old.IsDir() && !n.IsDir():
				return nil, merr(ErrIsDir, "meta: rename %s to %s", src, dst)
			case !old.IsDir() && n.IsDir():
				return nil, merr(ErrNotDir, "meta: rename %s to %s", src, dst)
			case old.IsDir():
				p := dentryPrefix(old.ID)
				kids, err := tx.Range(ctx, p, kv.PrefixEnd(p), 1)
				if err != nil {
					return nil, err
				}
				if len(kids) > 0 {
					return nil, merr(ErrNotEmpty, "meta: rename %s to %s", src, dst)
				}
				tx.Delete(inodeKey(old.ID))
				tx.Delete(dirTimeKey(old.ID))
				replacedDir = true
			default:
				dropName(tx, old, dp, dname)
			}
		}
		tx.Delete(dentryKey(sp, sname))
		touchDir(tx, sp)
		touchDir(tx, dp)
		if n.IsDir() {
			// n leaves sp and joins dp, where it may replace a directory.
			in := 1
			if replacedDir {
				in = 0
			}
			if sp == dp {
				in--
			} else if err := addSubdirs(ctx, tx, sp, -1); err != nil {
				return nil, err
			}
			if err := addSubdirs(ctx, tx, dp, in); err != nil {
				return nil, err
			}
		}
		n.Parent, n.Name, n.CTime = dp, dname, nowNano()
		putInode(tx, n)
		putDentry(tx, dp, dname, n)
		return true, nil
	}, nil)
}

// notUnder fails with ErrInvalid if directory dir is dp or one of its
// ancestors (so moving dir into dp would make a cycle). It walks up from
// dp with conflict-checked reads: of two concurrent renames that would
// together make a cycle, one conflicts.
func notUnder(ctx context.Context, tx kv.Txn, dir, dp uint64, src, dst string) error {
	for cur, steps := dp, 0; ; steps++ {
		if cur == dir {
			return merr(ErrInvalid, "meta: rename %s to %s: a directory cannot move under itself", src, dst)
		}
		if cur == RootInode {
			return nil
		}
		a, err := getInode(ctx, tx, cur)
		if err != nil {
			return err
		}
		if steps > 4096 {
			return fmt.Errorf("meta: rename %s: directory chain too deep at inode %d", dst, cur)
		}
		cur = a.Parent
	}
}

// --- files: write sessions, publication, length ---

// BeginFile starts a new file to be published at path by CommitFile: it
// allocates an inode with a layout that no directory names yet and opens
// a write session on it. The parent directory must exist.
// The file gets owner o (nil: none stored).
func (s *Service) BeginFile(ctx context.Context, path, client string, o *fs.Owner) (*Inode, string, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, "", err
	}
	if len(comps) == 0 {
		return nil, "", merr(ErrIsDir, "meta: create /")
	}
	id, err := s.allocID(ctx)
	if err != nil {
		return nil, "", err
	}
	layout, err := s.newLayout()
	if err != nil {
		return nil, "", err
	}
	sid := newSessionID()
	var n *Inode
	err = s.store.Update(ctx, func(tx kv.Txn) error {
		parent, err := parentInode(ctx, tx, path, comps)
		if err != nil {
			return err
		}
		pid := parent.ID
		n = newInode(id, TypeFile, parent, "", o)
		n.Parent, n.Nlink, n.Layout = 0, 0, layout
		var de Dentry
		ok, err := getDentry(ctx, snap{tx}, dentryKey(pid, comps[len(comps)-1]), &de)
		if err != nil {
			return err
		}
		if ok && de.IsDir {
			return merr(ErrIsDir, "meta: create %s", path)
		}
		putInode(tx, n)
		setJSON(tx, sessionKey(id, sid), session{Client: client, Expires: time.Now().Add(s.opts.SessionTTL).UnixNano()})
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return n, sid, nil
}

// OpenWrite opens a write session on the existing file at path (for
// writers at any offset); with create, a missing file is created first.
func (s *Service) OpenWrite(ctx context.Context, req, path, client string, create, exclusive bool, o *fs.Owner) (*Inode, string, error) {
	if create && client != "" {
		return s.create(ctx, req, path, exclusive, o, client)
	}
	if create {
		if _, err := s.Create(ctx, req, path, exclusive, o); err != nil {
			return nil, "", err
		}
	}
	comps, err := splitPath(path)
	if err != nil {
		return nil, "", err
	}
	sid := newSessionID()
	var n *Inode
	err = s.store.Update(ctx, func(tx kv.Txn) error {
		id, d, err := walk(ctx, snap{tx}, path, comps)
		if err != nil {
			return err
		}
		if d == nil || d.IsDir {
			return merr(ErrIsDir, "meta: open %s for writing", path)
		}
		if n, err = getInode(ctx, tx, id); err != nil {
			return err
		}
		if n.Type != TypeFile {
			return merr(ErrInvalid, "meta: open %s for writing: not a regular file", path)
		}
		if !n.Holes {
			// Written at offsets from now on: it may have holes.
			n.Holes = true
			putInode(tx, n)
		}
		setJSON(tx, sessionKey(id, sid), session{Client: client, Expires: time.Now().Add(s.opts.SessionTTL).UnixNano()})
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return n, sid, nil
}

// CommitFile publishes inode (from BeginFile) at path with length size,
// replacing an existing file there atomically, and ends the session.
func (s *Service) CommitFile(ctx context.Context, req, path string, inode uint64, sid string, size int64) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	if len(comps) == 0 {
		return nil, merr(ErrIsDir, "meta: commit /")
	}
	var out Inode
	err = s.withIdem(ctx, req, func(tx kv.Txn) (any, error) {
		pid, err := parentDir(ctx, tx, path, comps)
		if err != nil {
			return nil, err
		}
		name := comps[len(comps)-1]
		n, err := getInode(ctx, tx, inode)
		if err != nil {
			return nil, err
		}
		if n.Parent != 0 {
			return nil, merr(ErrInvalid, "meta: commit %s: inode %d is already published", path, inode)
		}
		if _, ok, err := tx.Get(ctx, sessionKey(inode, sid)); err != nil || !ok {
			if err == nil {
				err = merr(ErrInvalid, "meta: commit %s: the write session expired (inode %d)", path, inode)
			}
			return nil, err
		}
		var de Dentry
		ok, err := getDentry(ctx, tx, dentryKey(pid, name), &de)
		if err != nil {
			return nil, err
		}
		if ok {
			if de.IsDir {
				return nil, merr(ErrIsDir, "meta: commit %s", path)
			}
			old, err := getInode(ctx, tx, de.Inode)
			if err != nil {
				return nil, err
			}
			dropName(tx, old, pid, name)
		}
		tx.Delete(sessionKey(inode, sid))
		touchDir(tx, pid)
		n.Parent, n.Name, n.Nlink = pid, name, 1
		n.Size = max(n.Size, size)
		n.MTime = nowNano()
		n.CTime = n.MTime
		putInode(tx, n)
		putDentry(tx, pid, name, n)
		return n, nil
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Extend records that bytes up to end of inode are written and
// acknowledged: the length becomes max(length, end). A report made before
// a shrinking truncate (truncVer older) is ignored. It renews session sid
// when given. It returns the inode after the change.
func (s *Service) Extend(ctx context.Context, inode uint64, end int64, truncVer uint64, sid string) (*Inode, error) {
	var n *Inode
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		var err error
		if n, err = getInode(ctx, tx, inode); err != nil {
			return err
		}
		if sid != "" {
			setJSON(tx, sessionKey(inode, sid), session{Client: "", Expires: time.Now().Add(s.opts.SessionTTL).UnixNano()})
		}
		if end <= n.Size || truncVer < n.TruncVer {
			return nil
		}
		n.Size, n.MTime = end, nowNano()
		n.CTime = n.MTime
		putInode(tx, n)
		if n.linked() {
			putDentry(tx, n.Parent, n.Name, n)
		}
		return nil
	})
	return n, err
}

// CloseSession ends a write session, recording its final end first (as
// Extend), in one transaction.
func (s *Service) CloseSession(ctx context.Context, inode uint64, sid string, end int64, truncVer uint64) (*Inode, error) {
	var n *Inode
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		m, err := getInode(ctx, tx, inode)
		if err != nil {
			return err
		}
		if end > m.Size && truncVer >= m.TruncVer {
			m.Size, m.MTime = end, nowNano()
			m.CTime = m.MTime
			putInode(tx, m)
			if m.linked() {
				putDentry(tx, m.Parent, m.Name, m)
			}
		}
		cp := *m
		n = &cp
		tx.Delete(sessionKey(inode, sid))
		if m.Parent == 0 {
			return s.maybeCollectUnlinked(ctx, tx, m, sid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// AbandonFile ends session sid of an unpublished file: its chunks are
// collected.
func (s *Service) AbandonFile(ctx context.Context, inode uint64, sid string) error {
	return s.store.Update(ctx, func(tx kv.Txn) error {
		tx.Delete(sessionKey(inode, sid))
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
}

// maybeCollectUnlinked queues unlinked inode n for collection when no
// session but the ending one (sid) remains.
func (s *Service) maybeCollectUnlinked(ctx context.Context, tx kv.Txn, n *Inode, sid string) error {
	p := sessionPrefix(n.ID)
	others, err := tx.Range(ctx, p, kv.PrefixEnd(p), 2)
	if err != nil {
		return err
	}
	for _, o := range others {
		if string(o.Key) != string(sessionKey(n.ID, sid)) {
			return nil
		}
	}
	if _, ok, err := tx.Get(ctx, gcKey(n.ID)); err != nil || ok {
		return err
	}
	unlinkFile(tx, n, false)
	return nil
}

// Truncate sets the length of the file at path. Shrinking needs no other
// writer (ErrBusy otherwise; sid, the caller's own session, may be open);
// the cut chunks are removed before Truncate returns, or by the collector
// if this server dies first.
func (s *Service) Truncate(ctx context.Context, path string, size int64, sid string) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	return s.truncate(ctx, path, size, sid, func(tx kv.Txn) (uint64, error) {
		id, d, err := walk(ctx, snap{tx}, path, comps)
		if err != nil {
			return 0, err
		}
		if d == nil || d.IsDir {
			return 0, merr(ErrIsDir, "meta: truncate %s", path)
		}
		return id, nil
	})
}

// TruncateInode is Truncate of an open file by inode (it may have been
// renamed or removed since it was opened).
func (s *Service) TruncateInode(ctx context.Context, inode uint64, size int64, sid string) (*Inode, error) {
	return s.truncate(ctx, fmt.Sprintf("inode %d", inode), size, sid, func(kv.Txn) (uint64, error) { return inode, nil })
}

func (s *Service) truncate(ctx context.Context, what string, size int64, sid string, resolve func(tx kv.Txn) (uint64, error)) (*Inode, error) {
	if size < 0 {
		return nil, merr(ErrInvalid, "meta: truncate %s to %d", what, size)
	}
	var n *Inode
	var rec *gcRecord
	err := s.store.Update(ctx, func(tx kv.Txn) error {
		rec = nil
		id, err := resolve(tx)
		if err != nil {
			return err
		}
		if n, err = getInode(ctx, tx, id); err != nil {
			return err
		}
		if n.IsDir() {
			return merr(ErrIsDir, "meta: truncate %s", what)
		}
		if n.Type != TypeFile {
			return merr(ErrInvalid, "meta: truncate %s: not a regular file", what)
		}
		if size < n.Size {
			p := sessionPrefix(id)
			ss, err := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
			if err != nil {
				return err
			}
			for _, x := range ss {
				if string(x.Key) != string(sessionKey(id, sid)) {
					return merr(ErrBusy, "meta: truncate %s: another writer has it open", what)
				}
			}
			n.TruncVer++
			if n.Layout != nil {
				cs := n.Layout.ChunkSize
				rec = &gcRecord{Inode: id, Layout: *n.Layout, FromIndex: uint64((size + cs - 1) / cs), Size: size, Queued: nowNano()}
				setJSON(tx, gcKey(id), rec)
			}
		}
		n.Size, n.MTime = size, nowNano()
		n.CTime = n.MTime
		putInode(tx, n)
		if n.linked() {
			putDentry(tx, n.Parent, n.Name, n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if err := s.collect(ctx, rec); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func newSessionID() string {
	return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
}

// AttrChange is what SetAttr changes; nil fields stay.
type AttrChange struct {
	Perm *uint32 `json:"perm,omitempty"` // & 07777
	Uid  *uint32 `json:"uid,omitempty"`
	Gid  *uint32 `json:"gid,omitempty"`
	// ATime and MTime: unix nanoseconds.
	ATime *int64 `json:"atime,omitempty"`
	MTime *int64 `json:"mtime,omitempty"`
}

// SetAttr changes the permission bits, owner and times of the node at
// path (permission checks are the caller's: the FUSE mount, the kernel).
// An inode without stored mode and owner gets the defaults first (0644
// files, 0755 directories, owner 0). Any change sets the change time.
// It is idempotent, so a retry needs no request id.
func (s *Service) SetAttr(ctx context.Context, path string, c AttrChange) (*Inode, error) {
	return s.updateInode(ctx, path, func(n *Inode) error {
		if !n.Owned {
			n.Owned, n.Perm, n.Uid, n.Gid = true, 0o644, 0, 0
			if n.IsDir() {
				n.Perm = 0o755
			}
		}
		if c.Perm != nil {
			n.Perm = *c.Perm & 0o7777
		}
		if c.Uid != nil {
			n.Uid = *c.Uid
		}
		if c.Gid != nil {
			n.Gid = *c.Gid
		}
		if c.ATime != nil {
			n.ATime = *c.ATime
		}
		if c.MTime != nil {
			n.MTime = *c.MTime
		}
		n.CTime = nowNano()
		return nil
	})
}

// updateInode applies fn to the inode at path in one transaction (fn may
// run more than once) and refreshes the entry's copies of size and time.
func (s *Service) updateInode(ctx context.Context, path string, fn func(n *Inode) error) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	var n *Inode
	err = s.store.Update(ctx, func(tx kv.Txn) error {
		id, _, err := walk(ctx, snap{tx}, path, comps)
		if err != nil {
			return err
		}
		if n, err = getInode(ctx, tx, id); err != nil {
			return err
		}
		if err := fn(n); err != nil {
			return err
		}
		putInode(tx, n)
		if n.linked() && id != RootInode {
			putDentry(tx, n.Parent, n.Name, n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Mknod creates a metadata-only node at path: a symlink to target, a
// FIFO, a socket or a device node (rdev), with owner o (nil: none stored).
func (s *Service) Mknod(ctx context.Context, req, path string, t Type, target string, rdev uint32, o *fs.Owner) (*Inode, error) {
	comps, err := splitPath(path)
	if err != nil {
		return nil, err
	}
	if t < TypeSymlink || t > TypeBlock {
		return nil, merr(ErrInvalid, "meta: mknod %s: type %d", path, t)
	}
	if len(comps) == 0 {
		return nil, merr(iofs.ErrExist, "meta: mknod /")
	}
	if t == TypeSymlink && (target == "" || len(target) > 4095) {
		return nil, merr(ErrInvalid, "meta: symlink %s: target of %d bytes", path, len(target))
	}
	id, err := s.allocID(ctx)
	if err != nil {
		return nil, err
	}
	var out Inode
	err = s.withIdem(ctx, req, func(tx kv.Txn) (any, error) {
		parent, err := parentInode(ctx, tx, path, comps)
		if err != nil {
			return nil, err
		}
		name := comps[len(comps)-1]
		if _, ok, err := tx.Get(ctx, dentryKey(parent.ID, name)); err != nil || ok {
			if err == nil {
				err = merr(iofs.ErrExist, "meta: mknod %s", path)
			}
			return nil, err
		}
		n := newInode(id, t, parent, name, o)
		n.Rdev = rdev
		if t == TypeSymlink {
			n.Target, n.Size = target, int64(len(target))
		}
		putInode(tx, n)
		putDentry(tx, parent.ID, name, n)
		touchDir(tx, parent.ID)
		return n, nil
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Link makes dst a new name of the non-directory at src (a hard link).
func (s *Service) Link(ctx context.Context, req, src, dst string) (*Inode, error) {
	sc, err := splitPath(src)
	if err != nil {
		return nil, err
	}
	dc, err := splitPath(dst)
	if err != nil {
		return nil, err
	}
	if len(sc) == 0 || len(dc) == 0 {
		return nil, merr(ErrNotPermitted, "meta: link %s to %s", src, dst)
	}
	var out Inode
	err = s.withIdem(ctx, req, func(tx kv.Txn) (any, error) {
		_, _, sde, err := lookupEntry(ctx, tx, "link", src, sc)
		if err != nil {
			return nil, err
		}
		n, err := getInode(ctx, tx, sde.Inode)
		if err != nil {
			return nil, err
		}
		if n.IsDir() {
			return nil, merr(ErrNotPermitted, "meta: link %s: a directory", src)
		}
		dp, err := parentDir(ctx, tx, dst, dc)
		if err != nil {
			return nil, err
		}
		dname := dc[len(dc)-1]
		if _, ok, err := tx.Get(ctx, dentryKey(dp, dname)); err != nil || ok {
			if err == nil {
				err = merr(iofs.ErrExist, "meta: link %s", dst)
			}
			return nil, err
		}
		n.Nlink++
		n.CTime = nowNano()
		if !n.linked() {
			n.Parent, n.Name = dp, dname
		} else {
			putDentry(tx, n.Parent, n.Name, n) // now one of several names (Dentry.Shared)
		}
		putInode(tx, n)
		putDentry(tx, dp, dname, n)
		touchDir(tx, dp)
		return n, nil
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Xattr operations.
const (
	XattrSet    = 1
	XattrRemove = 2
)

// MaxXattrValue is the largest extended attribute value (as ext4's).
const MaxXattrValue = 64 << 10

// Xattr sets (op XattrSet, flags fs.XattrCreate/fs.XattrReplace) or
// removes (XattrRemove) extended attribute name of the node at path.
// Reading them is Stat (Inode.Xattrs).
func (s *Service) Xattr(ctx context.Context, path string, op int, name string, value []byte, flags int) (*Inode, error) {
	if name == "" || len(name) > fs.MaxNameLen {
		return nil, merr(ErrNameTooLong, "meta: xattr %q of %s", name, path)
	}
	if len(value) > MaxXattrValue {
		return nil, merr(ErrInvalid, "meta: xattr %s of %s: value of %d bytes", name, path, len(value))
	}
	return s.updateInode(ctx, path, func(n *Inode) error {
		_, has := n.Xattrs[name]
		switch {
		case op == XattrRemove || flags&fs.XattrReplace != 0:
			if !has {
				return merr(ErrNoAttr, "meta: xattr %s of %s", name, path)
			}
		case flags&fs.XattrCreate != 0 && has:
			return merr(iofs.ErrExist, "meta: xattr %s of %s", name, path)
		}
		if op == XattrRemove {
			delete(n.Xattrs, name)
		} else {
			if n.Xattrs == nil {
				n.Xattrs = map[string][]byte{}
			}
			n.Xattrs[name] = append([]byte{}, value...)
		}
		n.CTime = nowNano()
		return nil
	})
}
