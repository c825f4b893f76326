// Package clusterfs is the ffkit cluster as an fs.FS: files and
// directories from the metadata service (package fs/meta), bytes from the
// chain-replicated storage through the chunk client (package fs/client).
// Importing it registers the "ffkit" scheme, so fs.Resolve accepts
// ffkit://HOST:PORT[,HOST:PORT...]/path, where the addresses are mgmtd's
// (several: a client finds a standby). mgmtd's routing lists the live
// metadata servers; a dead metadata server is replaced by another
// transparently.
//
// The cluster token comes from $FFKIT_TOKEN, else from the user's token
// file written by `ffkit fs up` / `ffkit fs mgmtd` (see client.LookupToken).
//
// Files: a file's chunk i (ChunkSize bytes each) lives on chain
// Layout.Chains[i % len(Chains)], chosen by the metadata service when the
// file is created. Create writes an unpublished inode (full chunks are
// written as they fill, a few in parallel) and Commit publishes it under
// its name atomically, replacing an existing file; Close without Commit
// leaves nothing visible and the chunks are collected. ReadBatch maps
// byte ranges of files to chunk ranges and hands them all to the chunk
// client's batched read, which groups them per storage service and merges
// neighbours.
//
// Concurrency: an FS and its Files are safe for concurrent use; a Writer
// belongs to one goroutine. ReadBatch and ReadAt keep no reference to the
// caller's buffers.
package clusterfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/meta"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() {
	fs.RegisterScheme("ffkit", func(ctx context.Context, authority string) (fs.FS, error) {
		return Open(ctx, authority, Options{NoLocalReads: os.Getenv("FFKIT_LOCAL_READS") == "0"})
	})
}

// ErrCorrupt: storage returned fewer bytes than the file's length implies.
var ErrCorrupt = errkind.New(errkind.Data, "clusterfs: data missing from storage")

// Options tune an FS. Zero values take the defaults.
type Options struct {
	// Token is the cluster secret. Default: client.LookupCluster(authority).
	Token string
	// Trust is the cluster's CA. Default: client.LookupCluster's.
	Trust *trust.Bundle
	// WriteParallel bounds the chunk writes in flight per Writer. Default 4.
	WriteParallel int
	// RetryTimeout: how long calls retry through failures. Default 60 s.
	RetryTimeout time.Duration
	// WriteBehind is how many bytes of small writes (under 128 KiB) a
	// WriteFile of OpenWrite buffers before it writes them back (see
	// writebehind.go). Default 64 MiB; negative: none, every write goes
	// through at once.
	WriteBehind int64
	// NoLocalReads turns off short-circuit reads of chunk files held by
	// storage services on this host (client.Options.NoLocalReads). Opened
	// by URL (ffkit://...), FFKIT_LOCAL_READS=0 sets it.
	NoLocalReads bool
}

// FS is a connection to one ffkit cluster.
type FS struct {
	authority string
	opts      Options
	chunks    *client.Client
	meta      *meta.Client
	writers   writerCount // open WriteFiles per inode (write-behind gap filling)
}

var (
	_ fs.FS = (*FS)(nil)
)

// Open connects to the cluster whose mgmtd listens at authority
// ("host:port" or "h1:p1,h2:p2").
func Open(ctx context.Context, authority string, opts Options) (*FS, error) {
	var addrs []string
	for _, a := range strings.Split(authority, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no host:port in %q", fs.ErrBadPath, authority)
	}
	if opts.Token == "" {
		t, b, err := client.LookupCluster(authority)
		if err != nil {
			return nil, errkind.Wrap(errkind.Usage, fmt.Errorf("clusterfs: %w (pass --token-file or set FFKIT_TOKEN)", err))
		}
		opts.Token = t
		if opts.Trust == nil {
			opts.Trust = b
		}
	}
	if opts.WriteParallel <= 0 {
		opts.WriteParallel = 4
	}
	if opts.WriteBehind == 0 {
		opts.WriteBehind = 64 << 20
	}
	if opts.RetryTimeout <= 0 {
		opts.RetryTimeout = client.RetryWindow()
	}
	cc, err := client.Dial(ctx, addrs, client.Options{Token: opts.Token, Trust: opts.Trust, RetryTimeout: opts.RetryTimeout, NoLocalReads: opts.NoLocalReads})
	if err != nil {
		return nil, fmt.Errorf("clusterfs: %w", err)
	}
	f := &FS{authority: authority, opts: opts, chunks: cc}
	discover := func(ctx context.Context) ([]string, error) {
		if err := cc.Refresh(ctx); err != nil {
			return nil, err
		}
		return cc.Routing().Meta, nil
	}
	f.meta, err = meta.NewClient(meta.ClientOptions{Token: opts.Token, Trust: opts.Trust, Servers: cc.Routing().Meta, Discover: discover,
		RetryTimeout: opts.RetryTimeout})
	if err != nil {
		cc.Close()
		return nil, err
	}
	return f, nil
}

// Close closes the connections.
func (f *FS) Close() error {
	f.meta.Close()
	return f.chunks.Close()
}

// Chunks is the chunk client (for status and tools).
func (f *FS) Chunks() *client.Client { return f.chunks }

// Meta is the metadata client (for tools).
func (f *FS) Meta() *meta.Client { return f.meta }

func (f *FS) String() string { return "ffkit://" + f.authority }

// abs makes name an absolute cluster path.
func abs(name string) string {
	if !strings.HasPrefix(name, "/") {
		name = "/" + name
	}
	return path.Clean(name)
}

// wrap adds the operation and path, and marks an unreachable cluster with
// fs.ErrUnavailable.
func wrap(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, meta.ErrNoServer) || errors.Is(err, fs.ErrUnavailable) {
		if !errors.Is(err, fs.ErrUnavailable) {
			return fmt.Errorf("%s %s: %w: %w", op, name, fs.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("%s %s: %w", op, name, err)
}

func info(name string, n *meta.Inode) fs.FileInfo {
	b := path.Base(name)
	if name == "/" {
		b = "/"
	}
	fi := fs.FileInfo{Name: b, Size: n.Size, IsDir: n.IsDir(), ModTime: time.Unix(0, n.MTime),
		Perm: n.Perm, Uid: n.Uid, Gid: n.Gid, HasOwner: n.Owned,
		Nlink: uint32(max(n.Nlink, 0)), Ino: n.ID, Rdev: n.Rdev,
		ATime: time.Unix(0, n.ATime), CTime: time.Unix(0, n.CTime)}
	if n.Type > meta.TypeDir {
		fi.Kind = fs.Kind(n.Type)
	}
	if n.ATime == 0 {
		fi.ATime = fi.ModTime // stored before atime was kept
	}
	if n.CTime == 0 {
		fi.CTime = fi.ModTime
	}
	return fi
}

var _ fs.AttrSetter = (*FS)(nil)

// SetAttr stores permission bits, owner and times (chmod, chown, utimensat).
func (f *FS) SetAttr(ctx context.Context, name string, c fs.AttrChange) (fs.FileInfo, error) {
	p := abs(name)
	a := meta.AttrChange{Perm: c.Perm, Uid: c.Uid, Gid: c.Gid}
	if c.ATime != nil {
		t := c.ATime.UnixNano()
		a.ATime = &t
	}
	if c.MTime != nil {
		t := c.MTime.UnixNano()
		a.MTime = &t
	}
	n, err := f.meta.SetAttr(ctx, p, a)
	if err != nil {
		return fs.FileInfo{}, wrap("setattr", f.String()+p, err)
	}
	return info(p, n), nil
}

// Stat describes a file or directory.
func (f *FS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	p := abs(name)
	n, err := f.meta.Stat(ctx, p)
	if err != nil {
		return fs.FileInfo{}, wrap("stat", f.String()+p, err)
	}
	fi := info(p, n)
	fi.Sys = n // for OpenInfo
	return fi, nil
}

// List lists a directory, sorted by name.
func (f *FS) List(ctx context.Context, dir string) ([]fs.FileInfo, error) {
	p := abs(dir)
	es, err := f.meta.Readdir(ctx, p)
	if err != nil {
		return nil, wrap("list", f.String()+p, err)
	}
	out := make([]fs.FileInfo, len(es))
	for i, e := range es {
		out[i] = fs.FileInfo{Name: e.Name, Size: e.Size, IsDir: e.IsDir, ModTime: time.Unix(0, e.MTime), Ino: e.Inode,
			Perm: e.Perm, Uid: e.Uid, Gid: e.Gid, HasOwner: e.Owned}
		if e.Type > meta.TypeDir {
			out[i].Kind = fs.Kind(e.Type)
		}
		if e.Layout != nil && !e.IsDir && e.Type <= meta.TypeFile {
			// The listing read the file's inode: enough for OpenInfo.
			out[i].Sys = &meta.Inode{ID: e.Inode, Type: meta.TypeFile, Size: e.Size, MTime: e.MTime,
				Layout: e.Layout, Holes: e.Holes, Perm: e.Perm, Uid: e.Uid, Gid: e.Gid, Owned: e.Owned}
		}
	}
	return out, nil
}

// MkdirAll creates a directory and its missing parents.
func (f *FS) MkdirAll(ctx context.Context, dir string) error {
	p := abs(dir)
	_, err := f.meta.Mkdir(ctx, p, true)
	return wrap("mkdir", f.String()+p, err)
}

// Rename moves oldname to newname atomically, replacing a file there.
func (f *FS) Rename(ctx context.Context, oldname, newname string) error {
	o, n := abs(oldname), abs(newname)
	return wrap("rename", f.String()+o+" to "+n, f.meta.Rename(ctx, o, n))
}

// Remove removes a file or an empty directory.
func (f *FS) Remove(ctx context.Context, name string) error {
	p := abs(name)
	return wrap("remove", f.String()+p, f.meta.Remove(ctx, p))
}

// Open opens a file for reading. Direct reads bytes that are read
// locally (short-circuit, client.ChunkRead.Direct) and not in the page
// cache with O_DIRECT, so a cold pass neither waits for nor fills the
// page cache; other reads are the storage services' own I/O either way.
func (f *FS) Open(ctx context.Context, name string, opts fs.OpenOptions) (fs.File, error) {
	p := abs(name)
	n, err := f.meta.Stat(ctx, p)
	if err != nil {
		return nil, wrap("open", f.String()+p, err)
	}
	if n.IsDir() {
		return nil, fmt.Errorf("open %s%s: %w", f.String(), p, meta.ErrIsDir)
	}
	if n.Layout == nil || len(n.Layout.Chains) == 0 || n.Layout.ChunkSize <= 0 {
		return nil, errkind.Wrap(errkind.Data, fmt.Errorf("open %s%s: inode %d has no layout", f.String(), p, n.ID))
	}
	return &file{fs: f, name: name, inode: n, direct: opts.Direct}, nil
}

var _ fs.InfoOpener = (*FS)(nil)

// OpenInfo opens the file a Stat of this FS described, with no round trip:
// the inode (its layout and length) is the one that Stat returned.
func (f *FS) OpenInfo(name string, fi fs.FileInfo, opts fs.OpenOptions) (fs.File, bool) {
	n, ok := fi.Sys.(*meta.Inode)
	if !ok || n.IsDir() || n.Layout == nil || len(n.Layout.Chains) == 0 || n.Layout.ChunkSize <= 0 {
		return nil, false
	}
	return &file{fs: f, name: name, inode: n, direct: opts.Direct}, true
}

type file struct {
	fs     *FS
	name   string
	inode  *meta.Inode // as of Open; never modified
	direct bool        // fs.OpenOptions.Direct
}

var _ fs.InfoFile = (*file)(nil)

func (r *file) Size() int64 { return r.inode.Size }

// Info describes the file as of its open (the inode it read).
func (r *file) Info() fs.FileInfo { return info(r.name, r.inode) }
func (r *file) Name() string      { return r.name }
func (r *file) Close() error      { return nil }

// span is one chunk read and what the file's length says it must hold.
type span struct {
	want int // bytes that must come from stored data
}

// plan appends the chunk reads covering buf at off (all inside the file).
func (r *file) plan(off int64, buf []byte, reads []client.ChunkRead, spans []span) ([]client.ChunkRead, []span) {
	l := r.inode.Layout
	cs := l.ChunkSize
	for len(buf) > 0 {
		idx := uint64(off / cs)
		in := off % cs
		k := min(int64(len(buf)), cs-in)
		reads = append(reads, client.ChunkRead{Chain: l.Chain(idx), Chunk: client.ChunkID{Inode: r.inode.ID, Index: idx}, Off: in, Buf: buf[:k], Direct: r.direct})
		spans = append(spans, span{want: int(k)})
		buf, off = buf[k:], off+k
	}
	return reads, spans
}

func (r *file) check(reads []client.ChunkRead, spans []span) error {
	if r.inode.Holes {
		return nil // written at offsets: unwritten ranges are holes (zeros)
	}
	for i, rd := range reads {
		if rd.N < spans[i].want {
			return fmt.Errorf("%w: %s%s: chunk %d (inode %d, chain %d) holds %d bytes at offset %d, the file's length %d needs %d",
				ErrCorrupt, r.fs.String(), r.name, rd.Chunk.Index, rd.Chunk.Inode, rd.Chain, rd.N, rd.Off, r.inode.Size, spans[i].want)
		}
	}
	return nil
}

// ReadAt reads len(p) bytes at off; short at the end of the file with io.EOF.
func (r *file) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: %s: negative offset %d", fs.ErrBadPath, r.name, off)
	}
	if off >= r.inode.Size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.inode.Size-off))
	reads, spans := r.plan(off, p[:n], nil, nil)
	if err := r.fs.chunks.ReadChunks(context.Background(), reads); err != nil {
		return 0, wrap("read", r.fs.String()+r.name, err)
	}
	if err := r.check(reads, spans); err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ReadBatch reads many ranges of many files of this FS in one batched
// chunk read.
func (f *FS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	var reads []client.ChunkRead
	var spans []span
	var owners []*file
	for i, q := range reqs {
		r, ok := q.File.(*file)
		if !ok || r.fs != f {
			return fmt.Errorf("%w: read request %d: file %q is not from %s", fs.ErrBadPath, i, q.File.Name(), f)
		}
		if q.Off < 0 || q.Off+int64(len(q.Buf)) > r.inode.Size {
			return fmt.Errorf("%w: %s%s: bytes [%d, %d) of a %d-byte file", fs.ErrShortRead, f, r.name, q.Off, q.Off+int64(len(q.Buf)), r.inode.Size)
		}
		before := len(reads)
		reads, spans = r.plan(q.Off, q.Buf, reads, spans)
		for j := before; j < len(reads); j++ {
			owners = append(owners, r)
		}
	}
	if len(reads) == 0 {
		return nil
	}
	if err := f.chunks.ReadChunks(ctx, reads); err != nil {
		return wrap("read batch", f.String(), err)
	}
	for i := range reads {
		if err := owners[i].check(reads[i:i+1], spans[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// Create starts writing a file, published under name by Commit.
func (f *FS) Create(ctx context.Context, name string) (fs.Writer, error) {
	p := abs(name)
	n, sid, err := f.meta.BeginFile(ctx, p)
	if err != nil {
		return nil, wrap("create", f.String()+p, err)
	}
	w := &writer{fs: f, ctx: ctx, name: p, inode: n, session: sid, lastRenew: time.Now()}
	w.g, w.gctx = errgroup.WithContext(ctx)
	w.g.SetLimit(f.opts.WriteParallel)
	return w, nil
}

type writer struct {
	fs        *FS
	ctx       context.Context
	name      string
	inode     *meta.Inode
	session   string
	buf       []byte // the chunk being filled
	index     uint64 // its index
	size      int64  // bytes written so far
	g         *errgroup.Group
	gctx      context.Context
	lastRenew time.Time
	done      bool // committed or closed
}

func (w *writer) flushChunk() {
	data, idx := w.buf, w.index
	w.buf, w.index = nil, w.index+1
	l := w.inode.Layout
	w.g.Go(func() error {
		err := w.fs.chunks.WriteChunk(w.gctx, l.Chain(idx), client.ChunkID{Inode: w.inode.ID, Index: idx}, 0, data)
		if err != nil {
			return fmt.Errorf("write chunk %d of %s%s: %w", idx, w.fs, w.name, err)
		}
		return nil
	})
}

func (w *writer) Write(p []byte) (int, error) {
	if w.done {
		return 0, fmt.Errorf("clusterfs: write to %s after Commit or Close", w.name)
	}
	cs := w.inode.Layout.ChunkSize
	n := 0
	for len(p) > 0 {
		if w.gctx.Err() != nil {
			return n, w.fail()
		}
		if w.buf == nil {
			w.buf = make([]byte, 0, cs)
		}
		k := min(len(p), int(cs)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p, n = p[k:], n+k
		w.size += int64(k)
		if int64(len(w.buf)) == cs {
			w.flushChunk()
		}
	}
	// Keep the write session alive through a long write.
	if time.Since(w.lastRenew) > 10*time.Second {
		if _, err := w.fs.meta.Extend(w.ctx, w.inode.ID, 0, 0, w.session); err != nil {
			return n, wrap("write", w.fs.String()+w.name, err)
		}
		w.lastRenew = time.Now()
	}
	return n, nil
}

// fail waits for the chunk writes and returns the first error.
func (w *writer) fail() error {
	err := w.g.Wait()
	if err == nil {
		err = w.gctx.Err()
	}
	return err
}

func (w *writer) Commit() error {
	if w.done {
		return fmt.Errorf("clusterfs: commit of %s after Commit or Close", w.name)
	}
	if len(w.buf) > 0 {
		w.flushChunk()
	}
	if err := w.g.Wait(); err != nil {
		w.abandon()
		return err
	}
	w.done = true
	if _, err := w.fs.meta.CommitFile(w.ctx, w.name, w.inode.ID, w.session, w.size); err != nil {
		return wrap("commit", w.fs.String()+w.name, err)
	}
	return nil
}

func (w *writer) abandon() {
	w.done = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	// If this fails the session expires and the collector removes the chunks.
	_ = w.fs.meta.AbandonFile(ctx, w.inode.ID, w.session)
}

func (w *writer) Close() error {
	if w.done {
		return nil
	}
	w.g.Wait()
	w.abandon()
	return nil
}

var _ fs.ReadStatser = (*FS)(nil)

// ReadStats reports the chunk client's batched read counters (requests to
// storage services, ranges and bytes), for requests per batch and bytes
// per request in benchmarks.
func (f *FS) ReadStats() fs.ReadStats {
	s := f.chunks.ReadStats()
	return fs.ReadStats{Calls: s.Calls, Requests: s.Requests, IOs: s.IOs, Bytes: s.Bytes, LocalBytes: s.LocalBytes}
}
