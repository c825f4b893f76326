package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
	"golang.org/x/sys/unix"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Chunk file layout: a HeaderSize header, then the chunk's bytes.
//
//	0   8  magic "FFKCHNK1"
//	8   8  version
//	16  8  chain version it was written under
//	24  8  length of the data
//	32  4  flags (1: removed, a tombstone; 2: request tags follow)
//	36  4  number of blocks n
//	40  4  CRC32C of bytes 0..40, the n block CRCs and the tags
//	44  4n CRC32C of each BlockSize block of data (the last may be short)
//	with flag 2, at 44+4n:
//	    4    number of tags k (at most maxChunkTags)
//	    16k  the client request tags (client, seq) of the latest
//	         versions up to this one, oldest first
//	... a hole up to HeaderSize
//	HeaderSize: data (4 KiB aligned)
//
// Files are named <chunk id>.<version> when committed and
// <chunk id>.<version>.p while pending.
const (
	HeaderSize   = 68 << 10
	maxBlocks    = (HeaderSize - 44) / 4
	fixedHeader  = 44
	flagRemoved  = 1
	flagTags     = 2
	pendingSufix = ".p"
)

var chunkMagic = []byte("FFKCHNK1")

func init() {
	if fixedHeader+4*proto.MaxChunkSize/proto.BlockSize+4+16*maxChunkTags > HeaderSize {
		panic("storage: header too small for MaxChunkSize and the request tags")
	}
}

// version is one stored version of a chunk.
type version struct {
	ver      uint64
	chainVer uint64
	length   int64
	removed  bool
	crcs     []uint32 // per block
	// tags are the client requests of the latest versions up to this one
	// (at most maxChunkTags, oldest first), all in this version's history:
	// a retried write already here is acknowledged, not applied again,
	// even when it arrived as an update from an earlier head (see
	// Service.applyChain). Stored in the header, so they survive a
	// restart; a whole-content update (resync transfer, a syncing
	// successor's copy) carries the sender's.
	tags []proto.Tag
}

// maxChunkTags is how many of a chunk's latest client requests a version
// carries (version.tags).
const maxChunkTags = 32

// checksum is the whole-chunk checksum compared between hops: a CRC32C of
// the length, the removed flag and the block CRCs.
func (v *version) checksum() uint32 {
	if v == nil {
		return 0
	}
	b := make([]byte, 0, 9+4*len(v.crcs))
	b = binary.BigEndian.AppendUint64(b, uint64(v.length))
	if v.removed {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	for _, c := range v.crcs {
		b = binary.BigEndian.AppendUint32(b, c)
	}
	return crc32c(b)
}

func encodeHeader(v *version) []byte {
	n := fixedHeader + 4*len(v.crcs)
	size := n
	if len(v.tags) > 0 {
		size += 4 + 16*len(v.tags)
	}
	h := make([]byte, size)
	copy(h, chunkMagic)
	binary.BigEndian.PutUint64(h[8:], v.ver)
	binary.BigEndian.PutUint64(h[16:], v.chainVer)
	binary.BigEndian.PutUint64(h[24:], uint64(v.length))
	var flags uint32
	if v.removed {
		flags |= flagRemoved
	}
	if len(v.tags) > 0 {
		flags |= flagTags
		binary.BigEndian.PutUint32(h[n:], uint32(len(v.tags)))
		for i, tg := range v.tags {
			binary.BigEndian.PutUint64(h[n+4+16*i:], tg.Client)
			binary.BigEndian.PutUint64(h[n+4+16*i+8:], tg.Seq)
		}
	}
	binary.BigEndian.PutUint32(h[32:], flags)
	binary.BigEndian.PutUint32(h[36:], uint32(len(v.crcs)))
	for i, c := range v.crcs {
		binary.BigEndian.PutUint32(h[44+4*i:], c)
	}
	sum := crc32.Update(crc32c(h[:40]), castagnoli, h[44:])
	binary.BigEndian.PutUint32(h[40:], sum)
	return h
}

// headerTags returns how many bytes of a header follow the block CRCs
// (the tag section, whose count is in tail's first 4 bytes).
func headerTags(flags uint32, tail []byte) (int, error) {
	if flags&flagTags == 0 {
		return 0, nil
	}
	if len(tail) < 4 {
		return 0, errors.New("short tag section")
	}
	k := binary.BigEndian.Uint32(tail)
	if k == 0 || k > maxChunkTags {
		return 0, fmt.Errorf("%d request tags", k)
	}
	return 4 + 16*int(k), nil
}

func decodeHeader(h []byte) (*version, error) {
	if len(h) < fixedHeader || !bytes.Equal(h[:8], chunkMagic) {
		return nil, errors.New("bad magic")
	}
	n := binary.BigEndian.Uint32(h[36:])
	if n > maxBlocks || len(h) < fixedHeader+4*int(n) {
		return nil, fmt.Errorf("%d blocks in a %d-byte header", n, len(h))
	}
	fl := binary.BigEndian.Uint32(h[32:])
	if fl&^(flagRemoved|flagTags) != 0 {
		return nil, fmt.Errorf("unknown flags %#x", fl)
	}
	end := fixedHeader + 4*int(n)
	tagBytes, err := headerTags(fl, h[end:])
	if err != nil {
		return nil, err
	}
	if len(h) < end+tagBytes {
		return nil, fmt.Errorf("short tag section in a %d-byte header", len(h))
	}
	sum := crc32.Update(crc32c(h[:40]), castagnoli, h[44:end+tagBytes])
	if sum != binary.BigEndian.Uint32(h[40:]) {
		return nil, errors.New("header checksum mismatch")
	}
	v := &version{
		ver:      binary.BigEndian.Uint64(h[8:]),
		chainVer: binary.BigEndian.Uint64(h[16:]),
		length:   int64(binary.BigEndian.Uint64(h[24:])),
		removed:  binary.BigEndian.Uint32(h[32:])&flagRemoved != 0,
		crcs:     make([]uint32, n),
	}
	for i := range v.crcs {
		v.crcs[i] = binary.BigEndian.Uint32(h[44+4*i:])
	}
	if tagBytes > 0 {
		v.tags = make([]proto.Tag, (tagBytes-4)/16)
		for i := range v.tags {
			o := end + 4 + 16*i
			v.tags[i] = proto.Tag{Client: binary.BigEndian.Uint64(h[o:]), Seq: binary.BigEndian.Uint64(h[o+8:])}
		}
	}
	if v.length < 0 || v.length > proto.MaxChunkSize || int64(n) != blocksFor(v.length) {
		return nil, fmt.Errorf("length %d with %d blocks", v.length, n)
	}
	return v, nil
}

func blocksFor(length int64) int64 { return (length + proto.BlockSize - 1) / proto.BlockSize }

// chunk is one chunk's state on a target.
type chunk struct {
	// The fields below are guarded by Target.mu.
	slot         slot     // the chunk's write slot: its updates run one at a time (slot.go)
	committed    *version // nil: never written (or dropped)
	pending      *version // nil: none; else pending.ver == commitVer()+1 or a full replace
	pendingSince time.Time
	corrupt      bool     // a read found a block checksum mismatch
	file         *fileRef // open handle of the committed version, or nil
}

// fileRef is a shared open handle of a committed chunk file: the chunk
// holds one reference while the version is current, each read one more.
type fileRef struct {
	f    File
	ver  uint64
	refs atomic.Int32

	mapOnce sync.Once
	mapped  []byte // read-only shared mapping of the whole file, or nil
	cached  bool   // held by its chunk (set before the ref is shared)
}

func (r *fileRef) release(t *Target) {
	if r.refs.Add(-1) == 0 {
		if r.mapped != nil {
			unix.Munmap(r.mapped)
		}
		r.f.Close()
		t.openFiles.Add(-1)
	}
}

// mapping maps the file (size bytes) once, for OS files; nil if it cannot.
// Committed chunk files are never written or truncated again (a new
// version is a new file), so the mapping stays valid until the last
// reference goes.
func (r *fileRef) mapping(size int64) []byte {
	r.mapOnce.Do(func() {
		if of, ok := r.f.(*os.File); ok && size > 0 {
			if m, err := unix.Mmap(int(of.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED); err == nil {
				r.mapped = m
			}
		}
	})
	return r.mapped
}

// hasTag tells whether the client request tag made version v or one of
// the versions before it that v remembers (version.tags). The caller
// holds the target's mutex.
func hasTag(v *version, tag proto.Tag) bool {
	return v != nil && tag.Client != 0 && slices.Contains(v.tags, tag)
}

// nextTags is the tag list of a version built on one with tags base by
// the client request tag (zero: none).
func nextTags(base []proto.Tag, tag proto.Tag) []proto.Tag {
	if tag.Client == 0 {
		return slices.Clone(base)
	}
	out := append(slices.Clone(base), tag)
	if len(out) > maxChunkTags {
		out = out[len(out)-maxChunkTags:]
	}
	return out
}

func (c *chunk) commitVer() uint64 {
	if c.committed == nil {
		return 0
	}
	return c.committed.ver
}

// Target is one directory of chunks: the replica of one chain.
type Target struct {
	ID  proto.TargetID
	Dir string
	vfs VFS

	mu     sync.Mutex
	chunks map[proto.ChunkID]*chunk // guarded by mu
	used   int64                    // bytes of committed data; guarded by mu

	openFiles atomic.Int64 // cached open chunk files (bounded by maxOpenFiles)
	dirSync   groupSync    // batches directory fsyncs of concurrent commits
}

// maxOpenFiles bounds the open chunk files a target caches for reads.
const maxOpenFiles = 2048

// ErrCorruptFile marks a chunk file whose header does not verify.
var errCorruptFile = errors.New("storage: corrupt chunk file")

func (t *Target) chunkDir() string { return filepath.Join(t.Dir, "chunks") }

func (t *Target) path(id proto.ChunkID, ver uint64, pending bool) string {
	name := id.String() + "." + strconv.FormatUint(ver, 10)
	if pending {
		name += pendingSufix
	}
	return filepath.Join(t.chunkDir(), name)
}

// OpenTarget loads a target directory, recovering from a crash: for each
// chunk the newest committed file wins, older ones are deleted, a pending
// file survives only if it is the next version and its header verifies.
func OpenTarget(vfs VFS, id proto.TargetID, dir string) (*Target, error) {
	t := &Target{ID: id, Dir: dir, vfs: vfs, chunks: map[proto.ChunkID]*chunk{}}
	if err := vfs.MkdirAll(t.chunkDir()); err != nil {
		return nil, fmt.Errorf("storage: target %d: %w", id, err)
	}
	if tt, ok := vfs.(Tightener); ok {
		if err := tt.Tighten(dir); err != nil {
			return nil, fmt.Errorf("storage: target %d: make %s private: %w", id, dir, err)
		}
	}
	names, err := vfs.ReadDir(t.chunkDir())
	if err != nil {
		return nil, fmt.Errorf("storage: target %d: %w", id, err)
	}
	type file struct {
		ver     uint64
		pending bool
		name    string
	}
	files := map[proto.ChunkID][]file{}
	for _, n := range names {
		base, pending := strings.CutSuffix(n, pendingSufix)
		i := strings.LastIndexByte(base, '.')
		if i < 0 {
			continue
		}
		cid, err1 := proto.ParseChunkID(base[:i])
		ver, err2 := strconv.ParseUint(base[i+1:], 10, 64)
		if err1 != nil || err2 != nil {
			continue // not ours
		}
		files[cid] = append(files[cid], file{ver, pending, n})
	}
	for cid, fl := range files {
		c := &chunk{}
		slices.SortFunc(fl, func(a, b file) int {
			if a.ver != b.ver {
				if a.ver < b.ver {
					return 1
				}
				return -1
			}
			return 0
		})
		// Newest committed.
		for _, f := range fl {
			if f.pending || c.committed != nil {
				continue
			}
			v, err := t.readHeader(filepath.Join(t.chunkDir(), f.name))
			if err != nil {
				// A committed file was fsynced before its rename, so a bad
				// header is corruption: keep the version, flag the chunk so
				// reads refuse it and resync replaces it.
				v = &version{ver: f.ver}
				c.corrupt = true
			}
			c.committed = v
		}
		for _, f := range fl {
			p := filepath.Join(t.chunkDir(), f.name)
			switch {
			case !f.pending && c.committed != nil && f.ver == c.committed.ver:
			case f.pending && f.ver > c.commitVer() && c.pending == nil:
				if v, err := t.readHeader(p); err == nil {
					c.pending = v
					c.pendingSince = time.Now()
					continue
				}
				vfs.Remove(p) // torn pending write: never acknowledged
			default:
				vfs.Remove(p)
			}
		}
		if c.committed == nil && c.pending == nil {
			continue
		}
		t.chunks[cid] = c
		if c.committed != nil {
			t.used += c.committed.length
		}
	}
	return t, nil
}

func (t *Target) readHeader(p string) (*version, error) {
	f, err := t.vfs.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := make([]byte, fixedHeader)
	if n, err := f.ReadAt(h, 0); n < fixedHeader {
		return nil, fmt.Errorf("%w: %s: short header: %v", errCorruptFile, p, err)
	}
	if n := binary.BigEndian.Uint32(h[36:]); n <= maxBlocks {
		extra := 4 * int(n)
		if binary.BigEndian.Uint32(h[32:])&flagTags != 0 {
			// The tag section's count, then the tags.
			h = append(h, make([]byte, extra+4)...)
			if k, err := f.ReadAt(h[fixedHeader:], fixedHeader); k < extra+4 {
				return nil, fmt.Errorf("%w: %s: short header: %v", errCorruptFile, p, err)
			}
			if k := binary.BigEndian.Uint32(h[fixedHeader+extra:]); k <= maxChunkTags {
				h = append(h, make([]byte, 16*k)...)
				if r, err := f.ReadAt(h[fixedHeader+extra+4:], int64(fixedHeader+extra+4)); r < 16*int(k) {
					return nil, fmt.Errorf("%w: %s: short header: %v", errCorruptFile, p, err)
				}
			}
		} else {
			h = append(h, make([]byte, extra)...)
			if k, err := f.ReadAt(h[fixedHeader:], fixedHeader); k < extra {
				return nil, fmt.Errorf("%w: %s: short header: %v", errCorruptFile, p, err)
			}
		}
	}
	v, err := decodeHeader(h)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errCorruptFile, p, err)
	}
	return v, nil
}

// get returns the chunk entry, creating an empty one.
func (t *Target) get(id proto.ChunkID) *chunk {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.chunks[id]
	if c == nil {
		c = &chunk{}
		t.chunks[id] = c
	}
	return c
}

// Meta describes a chunk replica (under the target lock).
func (t *Target) Meta(id proto.ChunkID) proto.ChunkMeta {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.metaLocked(id, t.chunks[id])
}

func (t *Target) metaLocked(id proto.ChunkID, c *chunk) proto.ChunkMeta {
	m := proto.ChunkMeta{Chunk: id}
	if c == nil {
		return m
	}
	m.CommitVer = c.commitVer()
	m.UpdateVer = m.CommitVer
	if c.pending != nil {
		m.UpdateVer = c.pending.ver
	}
	if c.committed != nil {
		m.Length = c.committed.length
		m.Checksum = c.committed.checksum()
		if c.committed.removed {
			m.Length = -1
		}
	}
	m.Corrupt = c.corrupt
	return m
}

// List returns the metadata of every chunk (tombstones included) with
// inode in [inodeLo, inodeHi], sorted by chunk id.
func (t *Target) List(inodeLo, inodeHi uint64) []proto.ChunkMeta {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []proto.ChunkMeta
	for id, c := range t.chunks {
		if id.Inode < inodeLo || id.Inode > inodeHi || (c.committed == nil && c.pending == nil) {
			continue
		}
		out = append(out, t.metaLocked(id, c))
	}
	slices.SortFunc(out, func(a, b proto.ChunkMeta) int {
		ka, kb := a.Chunk.Key(), b.Chunk.Key()
		return bytes.Compare(ka[:], kb[:])
	})
	return out
}

// Used is the bytes of committed chunk data on the target.
func (t *Target) Used() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

// Space returns the target's file system's capacity and free bytes
// (zero when its VFS cannot measure them).
func (t *Target) Space() (FSStat, error) {
	sf, ok := t.vfs.(StatFSer)
	if !ok {
		return FSStat{}, nil
	}
	return sf.StatFS(t.Dir)
}

// update describes the new version to build.
type update struct {
	op       proto.Op
	off      int64
	data     []byte
	full     bool     // data is the whole content (resync / syncing successor)
	crcs     []uint32 // PayloadCRCs of data, if known (verified on arrival)
	crc      uint32   // PayloadChecksum of data, valid when crcs != nil
	ver      uint64
	chainVer uint64
	tag      proto.Tag   // the client request (zero: none)
	tags     []proto.Tag // full: the sender's tags of the version (see version.tags)
	// cache: write the new chunk through the page cache (this target is
	// its preferred replica for reads, proto.ChunkHash); otherwise its
	// aligned blocks go around it where they can (direct.go).
	cache bool
}

// prepare builds the pending version u.ver of chunk id and makes it
// durable before returning (prepareAsync, then its durable step).
func (t *Target) prepare(id proto.ChunkID, c *chunk, u update) (*version, error) {
	nv, durable, err := t.prepareAsync(id, c, u)
	if err != nil {
		return nil, err
	}
	if err := durable(); err != nil {
		return nil, err
	}
	return nv, nil
}

// prepareAsync builds the pending version u.ver of chunk id from its
// committed version and the update and writes it to a pending file; the
// version is pending (reads answer "not committed") when it returns. The
// returned durable function fsyncs the file and its directory entry; the
// caller runs it, possibly while it forwards the update, and must not
// commit or acknowledge before it returned nil. The caller holds the chunk
// lock. A failure (of either step) leaves nothing behind.
func (t *Target) prepareAsync(id proto.ChunkID, c *chunk, u update) (*version, func() error, error) {
	t.mu.Lock()
	base := c.committed
	corrupt := c.corrupt
	old := c.pending
	var baseTags []proto.Tag
	if base != nil {
		baseTags = base.tags
	}
	t.mu.Unlock()
	if old != nil {
		// An older attempt's pending version (a crash, a retry): replaced.
		t.vfs.Remove(t.path(id, old.ver, true))
		t.mu.Lock()
		c.pending = nil
		t.mu.Unlock()
	}
	if base != nil && base.removed {
		base = nil
	}
	if corrupt && !u.full && u.op != proto.OpRemove {
		return nil, nil, fmt.Errorf("%w: chunk %v on target %d is corrupt; waiting for repair", proto.ErrChecksum, id, t.ID)
	}
	nv := &version{ver: u.ver, chainVer: u.chainVer}
	if u.full {
		// Another history: the tags of the version replaced do not hold;
		// the sender's do (a whole content it holds under the same tags).
		nv.tags = nextTags(u.tags, u.tag)
		if u.tag.Client != 0 && slices.Contains(u.tags, u.tag) {
			nv.tags = slices.Clone(u.tags)
		}
	} else {
		nv.tags = nextTags(baseTags, u.tag)
	}
	p := t.path(id, u.ver, true)
	f, err := t.vfs.Create(p)
	if err != nil {
		return nil, nil, t.ioErr("create", p, err)
	}
	fail := func(what string, err error) (*version, func() error, error) {
		f.Close()
		t.vfs.Remove(p)
		return nil, nil, t.ioErr(what, p, err)
	}
	var oldLen int64
	var oldCRCs []uint32
	if base != nil {
		oldLen, oldCRCs = base.length, base.crcs
	}
	switch {
	case u.op == proto.OpRemove:
		nv.removed = true
	case u.full:
		nv.length = int64(len(u.data))
		if err := t.writeData(f, p, u.data, HeaderSize, u.cache); err != nil {
			return fail("write", err)
		}
		if u.crcs != nil {
			nv.crcs = u.crcs // the payload starts at offset 0: the same blocks
		} else {
			nv.crcs = blockCRCs(u.data)
		}
	default:
		var src File
		if base != nil {
			if src, err = t.vfs.Open(t.path(id, base.ver, false)); err != nil {
				return fail("open base", err)
			}
			defer src.Close()
		}
		var writeLo, writeHi int64 // the range the update defines
		switch u.op {
		case proto.OpWrite:
			writeLo, writeHi = u.off, u.off+int64(len(u.data))
			nv.length = max(oldLen, writeHi)
		case proto.OpTruncate:
			writeLo, writeHi = u.off, u.off
			nv.length = u.off
		}
		// Copy the old bytes the update leaves alone.
		if src != nil {
			if err := copyRange(f, HeaderSize, src, HeaderSize, min(writeLo, oldLen, nv.length)); err != nil {
				return fail("copy", err)
			}
			if writeHi < oldLen && u.op == proto.OpWrite {
				if err := copyRange(f, HeaderSize+writeHi, src, HeaderSize+writeHi, oldLen-writeHi); err != nil {
					return fail("copy", err)
				}
			}
		}
		if len(u.data) > 0 {
			// A new chunk (no old bytes copied in): its blocks go
			// straight to the device where they can (direct.go).
			write := f.WriteAt
			if src == nil {
				write = func(b []byte, off int64) (int, error) { return len(b), t.writeData(f, p, b, off, u.cache) }
			}
			if _, err := write(u.data, HeaderSize+u.off); err != nil {
				return fail("write", err)
			}
		}
		if err := f.Truncate(HeaderSize + nv.length); err != nil {
			return fail("truncate", err)
		}
		// Block CRCs: untouched blocks keep theirs (so corruption of an old
		// block stays detectable); touched ones are computed.
		nb := blocksFor(nv.length)
		nv.crcs = make([]uint32, nb)
		blk := make([]byte, proto.BlockSize)
		for b := int64(0); b < nb; b++ {
			lo, hi := b*proto.BlockSize, min((b+1)*proto.BlockSize, nv.length)
			oldEnd := min((b+1)*proto.BlockSize, oldLen)
			unchanged := b < int64(len(oldCRCs)) && hi <= oldLen && oldEnd == hi &&
				(u.op != proto.OpWrite || hi <= writeLo || lo >= writeHi)
			switch {
			case unchanged:
				nv.crcs[b] = oldCRCs[b]
			case u.op == proto.OpWrite && lo >= writeLo && hi <= writeHi:
				k := (lo - writeLo) / proto.BlockSize
				if u.crcs != nil && (lo-writeLo)%proto.BlockSize == 0 && hi-writeLo == min((k+1)*proto.BlockSize, int64(len(u.data))) {
					nv.crcs[b] = u.crcs[k] // verified on arrival
				} else {
					nv.crcs[b] = crc32c(u.data[lo-writeLo : hi-writeLo])
				}
			default:
				if _, err := f.ReadAt(blk[:hi-lo], HeaderSize+lo); err != nil {
					return fail("read back", err)
				}
				nv.crcs[b] = crc32c(blk[:hi-lo])
			}
		}
	}
	if _, err := f.WriteAt(encodeHeader(nv), 0); err != nil {
		return fail("write header", err)
	}
	t.mu.Lock()
	c.pending = nv
	c.pendingSince = time.Now()
	t.mu.Unlock()
	durable := func() error {
		err := f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			// The pending file's directory entry: shared by concurrent
			// updates of the target (one fsync for all that arrived).
			err = t.dirSync.sync(func() error { return t.vfs.SyncDir(t.chunkDir()) })
		}
		if err != nil {
			t.mu.Lock()
			if c.pending == nv {
				c.pending = nil
			}
			t.mu.Unlock()
			t.vfs.Remove(p)
			return t.ioErr("fsync", p, err)
		}
		return nil
	}
	return nv, durable, nil
}

func blockCRCs(data []byte) []uint32 {
	crcs := make([]uint32, blocksFor(int64(len(data))))
	for b := range crcs {
		lo := b * proto.BlockSize
		crcs[b] = crc32c(data[lo:min(lo+proto.BlockSize, len(data))])
	}
	return crcs
}

func (t *Target) ioErr(what, p string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: target %d: %s %s: %v", proto.ErrNoSpace, t.ID, what, p, err)
	}
	return fmt.Errorf("%w: target %d: %s %s: %v", proto.ErrIO, t.ID, what, p, err)
}

// commit makes the pending version committed: rename it and drop the old
// file. The rename is not fsynced: the pending version is already durable
// (file and directory entry), and if a power loss undoes the rename the
// version comes back pending and recovery commits it (the head re-drives
// its pending versions; any other replica is resynced on restart), so an
// acknowledged write is never rolled back. The caller holds the chunk lock.
func (t *Target) commit(id proto.ChunkID, c *chunk) (*version, error) {
	t.mu.Lock()
	nv, old := c.pending, c.committed
	t.mu.Unlock()
	if nv == nil {
		return nil, fmt.Errorf("%w: chunk %v on target %d has nothing pending", proto.ErrMissingUpdate, id, t.ID)
	}
	if old != nil && old.ver > nv.ver {
		// Going back to a lower version (the predecessor's data wins): the
		// higher file goes first, or crash recovery would pick it again.
		if err := t.vfs.Remove(t.path(id, old.ver, false)); err != nil {
			return nil, t.ioErr("remove", t.path(id, old.ver, false), err)
		}
	}
	if err := t.vfs.Rename(t.path(id, nv.ver, true), t.path(id, nv.ver, false)); err != nil {
		return nil, t.ioErr("commit", t.path(id, nv.ver, true), err)
	}
	t.mu.Lock()
	c.committed, c.pending, c.corrupt = nv, nil, false
	if c.file != nil {
		c.file.release(t)
		c.file = nil
	}
	if old != nil {
		t.used -= old.length
	}
	t.used += nv.length
	t.mu.Unlock()
	if old != nil && old.ver != nv.ver {
		t.vfs.Remove(t.path(id, old.ver, false))
	}
	return nv, nil
}

// abort drops a pending version (resync replaced it).
func (t *Target) dropPending(id proto.ChunkID, c *chunk) {
	t.mu.Lock()
	p := c.pending
	c.pending = nil
	t.mu.Unlock()
	if p != nil {
		t.vfs.Remove(t.path(id, p.ver, true))
	}
}

// readCommitted reads [off, off+n) of the committed version into a new
// buffer (see readRef).
func (t *Target) readCommitted(id proto.ChunkID, off, n int64, allowPending bool) ([]byte, *version, error) {
	data, release, v, err := t.readRef(id, off, n, allowPending)
	if err != nil {
		return nil, v, err
	}
	out := append([]byte(nil), data...)
	release()
	return out, v, nil
}

// mmapMin: reads at least this large are served from a shared read-only
// mapping of the chunk file (checksummed in place and written to the
// socket from there: one copy fewer than pread); smaller ones too when the
// file's handle (and so its mapping) is cached, else they use pread.
const mmapMin = 64 << 10

// readRef reads [off, off+n) of the committed version, verifying the CRC
// of every block it touches. It returns fewer bytes when the chunk is
// shorter, none for a missing chunk; ErrNotCommitted if a version is
// pending (unless allowPending). The data may point into a mapping of the
// file or a pooled buffer: the caller must call release once done with it
// (after the reply is written).
func (t *Target) readRef(id proto.ChunkID, off, n int64, allowPending bool) ([]byte, func(), *version, error) {
	b, release, v, _, _, err := t.readRefSrc(id, off, n, allowPending, verifyHere)
	return b, release, v, err
}

// fileSrc names where a read's bytes lie in a chunk file, for sendfile.
type fileSrc struct {
	f   *os.File // nil: the bytes are only in memory
	off int64
	// cold (a clientLocal read): some of the bytes are not in the page
	// cache, and nothing was done to bring them in.
	cold bool
}

// readHow says who verifies a read, and where its bytes go.
type readHow int

const (
	verifyHere  readHow = iota // the target checks the block CRCs
	clientSums                 // the client checks them (proto.ReadIO.Sums)
	clientLocal                // and reads the file itself (proto.ReadIO.Local)
)

// readRefSrc is readRef, also returning, when the bytes are in a mapping
// of an OS file, that file and their offset in it: the file stays open
// until release, so the reply may send them from the page cache
// (sendfile) rather than copy them from the mapping. With clientSums, a
// block-aligned range (ending on a block boundary or at the chunk's end)
// in such a file is not verified here: its stored block CRCs are returned
// (non-nil) for the client to check the bytes against. With clientLocal,
// the bytes are not brought into the page cache either: the client reads
// them, with O_DIRECT if src.cold.
func (t *Target) readRefSrc(id proto.ChunkID, off, n int64, allowPending bool, how readHow) ([]byte, func(), *version, fileSrc, []uint32, error) {
	noop := func() {}
	var src fileSrc
	t.mu.Lock()
	c := t.chunks[id]
	var v *version
	corrupt := false
	if c != nil {
		if c.pending != nil && !allowPending {
			// Read the version under the lock: a commit may clear c.pending
			// the moment it is released.
			pv := c.pending.ver
			t.mu.Unlock()
			return nil, nil, nil, src, nil, fmt.Errorf("%w: chunk %v v%d pending on target %d", proto.ErrNotCommitted, id, pv, t.ID)
		}
		v, corrupt = c.committed, c.corrupt
	}
	t.mu.Unlock()
	if corrupt {
		return nil, nil, v, src, nil, fmt.Errorf("%w: chunk %v on target %d", proto.ErrChecksum, id, t.ID)
	}
	if v == nil || v.removed || off >= v.length {
		return nil, noop, v, src, nil, nil
	}
	end := min(off+n, v.length)
	lo := off / proto.BlockSize * proto.BlockSize
	hi := min((end+proto.BlockSize-1)/proto.BlockSize*proto.BlockSize, v.length)
	ref, err := t.openCommitted(id, c, v)
	if err != nil {
		// Replaced by a newer commit since we looked: read that one.
		t.mu.Lock()
		moved := c.committed != v
		t.mu.Unlock()
		if moved {
			return t.readRefSrc(id, off, n, allowPending, how)
		}
		return nil, nil, v, src, nil, t.ioErr("open", t.path(id, v.ver, false), err)
	}
	var buf []byte
	var release func()
	clientChecks := false
	// Small reads use the mapping too when the handle is cached (the
	// mapping is made once per file version): no system call per read.
	if m := ref.mapping(HeaderSize + v.length); m != nil && (hi-lo >= mmapMin || ref.cached) {
		buf = m[HeaderSize+lo : HeaderSize+hi]
		release = func() { ref.release(t) }
		if of, ok := ref.f.(*os.File); ok {
			src = fileSrc{f: of, off: HeaderSize + off}
		}
		clientChecks = how != verifyHere && src.f != nil && off == lo && end == hi
		switch {
		case how == clientLocal && clientChecks:
			src.cold = !resident(m, HeaderSize+lo, HeaderSize+hi)
		case hi-lo >= 256<<10:
			// Start reading the whole range from disk at once if it is not
			// cached, instead of faulting it in 128 KiB at a time.
			unix.Madvise(buf, unix.MADV_WILLNEED)
		}
	} else {
		defer ref.release(t)
		buf = transport.GetBuffer(int(hi - lo))
		if k, err := ref.f.ReadAt(buf, HeaderSize+lo); int64(k) < hi-lo {
			transport.PutBuffer(buf)
			return nil, nil, v, src, nil, t.ioErr("read", t.path(id, v.ver, false), fmt.Errorf("short read %d of %d: %v", k, hi-lo, err))
		}
		pooled := buf
		release = func() { transport.PutBuffer(pooled) }
	}
	if clientChecks {
		// The client checks the bytes against the stored block CRCs
		// (proto.ReadIO.Sums); they go out from the page cache unread.
		return buf, release, v, src, v.crcs[lo/proto.BlockSize : (hi+proto.BlockSize-1)/proto.BlockSize], nil
	}
	bad, err := verifyBlocks(buf, lo, hi, v.crcs)
	if err != nil {
		release()
		return nil, nil, v, src, nil, t.ioErr("read", t.path(id, v.ver, false), err)
	}
	if bad >= 0 {
		release()
		t.mu.Lock()
		if c.committed == v {
			c.corrupt = true
		}
		t.mu.Unlock()
		return nil, nil, v, src, nil, fmt.Errorf("%w: chunk %v v%d block %d on target %d", proto.ErrChecksum, id, v.ver, bad, t.ID)
	}
	return buf[off-lo : end-lo], release, v, src, nil, nil
}

// resident reports whether every page of m[lo:hi] is in the page cache.
func resident(m []byte, lo, hi int64) bool {
	page := int64(os.Getpagesize())
	lo &^= page - 1
	vec := make([]byte, (hi-lo+page-1)/page)
	b := m[lo:hi]
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return false
	}
	for _, v := range vec {
		if v&1 == 0 {
			return false
		}
	}
	return true
}

// verifyBlocks checks the CRC of every block of buf (chunk bytes [lo, hi))
// and returns the first bad block, or -1. Reading a mapping of a file that
// someone truncated behind our back faults: that becomes an error, not a
// crash.
func verifyBlocks(buf []byte, lo, hi int64, crcs []uint32) (bad int64, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("chunk file changed under a read: %v", r)
		}
	}()
	for b := lo / proto.BlockSize; b*proto.BlockSize < hi; b++ {
		s := b*proto.BlockSize - lo
		e := min(s+proto.BlockSize, hi-lo)
		if crc32c(buf[s:e]) != crcs[b] {
			return b, nil
		}
	}
	return -1, nil
}

// openCommitted returns a referenced handle of version v's file, cached
// on the chunk while v is current (the caller releases it).
func (t *Target) openCommitted(id proto.ChunkID, c *chunk, v *version) (*fileRef, error) {
	t.mu.Lock()
	if r := c.file; r != nil && r.ver == v.ver {
		r.refs.Add(1)
		t.mu.Unlock()
		return r, nil
	}
	t.mu.Unlock()
	f, err := t.vfs.Open(t.path(id, v.ver, false))
	if err != nil {
		return nil, err
	}
	r := &fileRef{f: f, ver: v.ver}
	r.refs.Store(1) // the caller's
	t.openFiles.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.committed == v && c.file == nil && t.openFiles.Load() <= maxOpenFiles {
		r.refs.Add(1) // the chunk's
		r.cached = true
		c.file = r
	}
	return r, nil
}

// groupSync runs one fsync for every caller that arrived before it
// started: commits that race share a directory fsync.
type groupSync struct {
	mu      sync.Mutex
	cond    *sync.Cond
	issued  uint64 // tickets handed out; guarded by mu
	done    uint64 // every ticket <= done is durable; guarded by mu
	running bool   // guarded by mu
}

func (g *groupSync) sync(fsync func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	g.issued++
	ticket := g.issued
	for g.done < ticket {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		covers := g.issued // everything issued so far was renamed before now
		g.mu.Unlock()
		err := fsync()
		g.mu.Lock()
		g.running = false
		g.cond.Broadcast()
		if err != nil {
			return err
		}
		g.done = max(g.done, covers)
	}
	return nil
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
