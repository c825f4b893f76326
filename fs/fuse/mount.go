package fuse

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrMount: the mount could not be set up (bad mount point, no /dev/fuse,
// no fusermount3).
var ErrMount = errkind.New(errkind.Usage, "fuse: cannot mount")

// Options configure a mount. The zero value is usable: every field has a
// default (given in its comment) applied by Mount.
type Options struct {
	// ReadOnly refuses every change with EROFS. Default false.
	ReadOnly bool
	// Timeout bounds every call into the storage; past it the caller gets
	// ETIMEDOUT. Default 75s: longer than the cluster client's own retry
	// budget (fs/client Options.RetryTimeout, 60s), so a failover in
	// progress is not cut short and the client's error wins when it gives up.
	Timeout time.Duration
	// AttrTimeout is how long names, attributes and missing names may be
	// cached, by the kernel and by the mount's own metadata cache (see
	// metacache.go): a change made by another client is seen within it;
	// this mount's own changes are seen at once. Default 0: nothing is
	// cached, every lookup and open revalidates (exact close-to-open
	// consistency). `ffkit fs mount` defaults to 1s.
	AttrTimeout time.Duration
	// MaxRequest is max_read/max_write. Default 1 MiB (capped by the
	// kernel's fs.fuse.max_pages_limit).
	MaxRequest int
	// MaxBackground is how many asynchronous requests (reads, direct I/O
	// with io_depth) the kernel keeps in flight. Default 256.
	MaxBackground int
	// MaxBatch is the most reads gathered into one ReadBatch. Default 128.
	MaxBatch int
	// Dispatchers is how many ReadBatch calls may run at once. Default 8.
	Dispatchers int
	// ReadAhead is the read-ahead window of a handle read sequentially.
	// Default 32 MiB; negative disables read-ahead.
	ReadAhead int
	// ReadAheadBlock is the size of each read-ahead read. Default 4 MiB
	// (the cluster's chunk size: one storage request per block; against
	// 1 MiB blocks the storage processes spent a fifth less CPU per byte
	// and the mount less too).
	ReadAheadBlock int
	// ReadAheadMemory bounds the memory of all read-ahead windows.
	// Default 256 MiB.
	ReadAheadMemory int64
	// ReadWhole: a file of at most this many bytes opened for reading is
	// fetched whole at open (in ReadAheadBlock-sized reads, in parallel)
	// and its reads, in any order, are served from memory until it is
	// closed. The memory comes from ReadAheadMemory: when it is used up,
	// files are read as usual. Default 16 MiB; negative disables it (so
	// does disabling read-ahead).
	ReadWhole int64
	// KernelReadAhead is the kernel's read-ahead for the mount (its BDI's
	// read_ahead_kb, set after mounting; needs root or a writable
	// /sys/class/bdi). The kernel then asks for the next bytes of a file
	// read through the page cache in parallel MaxRequest-sized reads,
	// before the reader needs them. Default 4 MiB; negative leaves the
	// kernel's default (128 KiB).
	KernelReadAhead int
	// NoStoreCache: a file fetched whole at open is not written into the
	// kernel's page cache (FUSE_NOTIFY_STORE) as it arrives, and no open
	// keeps the kernel's cache: its reads then each come to the mount.
	// Default false.
	NoStoreCache bool
	// WriteBuffer is the write-behind window of a file open for writing:
	// writes inside an aligned window of this size are gathered and stored
	// as one write when the writer moves on (see writeBuffer). Default
	// 4 MiB; negative disables write-behind.
	WriteBuffer int
	// WriteBehind is how many windows per file may be stored at once in
	// the background. Default 4.
	WriteBehind int
	// Direct opens backend files with fs.OpenOptions.Direct (O_DIRECT on
	// local files and on a cluster's short-circuit reads), so reads
	// through the mount are cold. Default false: only files a reader
	// opened with O_DIRECT are opened so.
	Direct bool
	// AllowOther lets other users access the mount, with access checked
	// by the kernel against the reported modes and owners
	// (default_permissions). Default false.
	AllowOther bool
	// FsName is the source shown in /proc/mounts. Default the backend's String().
	FsName string
	// Debug logs every FUSE request to Logger.
	Debug bool
	// Logger receives warnings (and debug output). Default: stderr.
	Logger *log.Logger
}

func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = 75 * time.Second
	}
	if o.MaxRequest <= 0 {
		o.MaxRequest = 1 << 20
	}
	if o.MaxBackground <= 0 {
		o.MaxBackground = 256
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.Dispatchers <= 0 {
		o.Dispatchers = 8
	}
	if o.ReadAhead == 0 {
		o.ReadAhead = 32 << 20
	}
	if o.ReadAheadBlock <= 0 {
		o.ReadAheadBlock = 4 << 20
	}
	if o.WriteBuffer == 0 {
		o.WriteBuffer = 4 << 20
	}
	if o.WriteBehind <= 0 {
		o.WriteBehind = 4
	}
	if o.ReadAheadMemory <= 0 {
		o.ReadAheadMemory = 256 << 20
	}
	if o.ReadWhole == 0 {
		o.ReadWhole = 16 << 20
	}
	if o.KernelReadAhead == 0 {
		o.KernelReadAhead = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = log.New(os.Stderr, "ffkit fuse: ", log.LstdFlags)
	}
}

// Validate reports options that make no sense.
func (o *Options) Validate() error {
	if o.MaxRequest != 0 && (o.MaxRequest < 4096 || o.MaxRequest > 16<<20) {
		return fmt.Errorf("%w: MaxRequest %d must be in [4 KiB, 16 MiB]", errkind.New(errkind.Usage, "fuse: bad options"), o.MaxRequest)
	}
	return nil
}

// Stats counts what a mount did since it started.
type Stats struct {
	Reads          int64 `json:"reads"`            // FUSE READ requests
	ReadBytes      int64 `json:"read_bytes"`       // bytes returned by them
	Writes         int64 `json:"writes"`           // FUSE WRITE requests
	WriteBytes     int64 `json:"write_bytes"`      // bytes written
	Batches        int64 `json:"batches"`          // ReadBatch calls for reads
	BatchedReads   int64 `json:"batched_reads"`    // reads in those calls
	ReadAheadHits  int64 `json:"read_ahead_hits"`  // reads served from read-ahead
	ReadAheadBytes int64 `json:"read_ahead_bytes"` // bytes fetched by read-ahead
	// ReadAheadWaits counts reads that found their read-ahead block still
	// being fetched (the reader caught up with the storage), and
	// ReadAheadWaitSeconds the time they waited.
	ReadAheadWaits       int64   `json:"read_ahead_waits"`
	ReadAheadWaitSeconds float64 `json:"read_ahead_wait_seconds"`
	// ReadAheadWasted counts read-ahead blocks dropped unread (before the
	// file was closed).
	ReadAheadWasted int64 `json:"read_ahead_wasted"`
	// ReadAheadHeld is the read-ahead blocks in memory now (being fetched,
	// or fetched and not yet freed); 0 once every read-ahead window is
	// closed and its fetches have ended.
	ReadAheadHeld int64 `json:"read_ahead_held"`
	// WholeFiles counts the files fetched whole at open (ReadWhole).
	WholeFiles int64 `json:"whole_files"`
	// StoredFiles counts the files written whole into the kernel's page
	// cache after their open (Options.NoStoreCache).
	StoredFiles int64 `json:"stored_files"`
	// KeptFiles counts the opens that kept the kernel's cache of a file
	// stored by an earlier open and unchanged since (no fetch).
	KeptFiles int64 `json:"kept_files"`
	// OpensFromLookup counts the opens that used the answer of the
	// LOOKUP before them (no metadata round trip of their own).
	OpensFromLookup int64 `json:"opens_from_lookup"`
	// FilesPrefetched counts the files fetched whole before their open
	// (read in listing order), PrefetchesUsed those an open adopted.
	FilesPrefetched int64 `json:"files_prefetched"`
	PrefetchesUsed  int64 `json:"prefetches_used"`
	// CreatesAsync counts the creates answered before they reached the
	// storage (see pending.go).
	CreatesAsync int64 `json:"creates_async"`
	Errors       int64 `json:"errors"` // requests answered with an errno
	// MetaCache counts the metadata cache's answers (Options.AttrTimeout).
	MetaCache MetaCacheStats `json:"meta_cache"`
}

// Server is a mounted file system.
type Server struct {
	backend fs.FS
	rw      fs.RandomAccessFS // nil if the backend cannot write at offsets
	root    string            // path inside backend that the mount shows
	mnt     string
	opts    Options
	srv     *gofuse.Server
	mc      *metaCache
	pf      *prefetcher // listing-order prefetch (prefetch.go)
	pend    *pendingOps // unlinks in flight (pending.go)
	uid     uint32
	gid     uint32

	ctx    context.Context // canceled by Unmount; parent of every backend call
	cancel context.CancelFunc
	wg     sync.WaitGroup // dispatchers and read-ahead fetches

	queue chan *readReq // reads waiting for a dispatcher
	raSem chan struct{} // one token per read-ahead block in flight or held
	// raActive counts the handles holding read-ahead blocks.
	raActive atomic.Int64
	nextIno  atomic.Uint64

	stats struct {
		reads, readBytes, writes, writeBytes, batches, batchedReads    atomic.Int64
		raHits, raBytes, raWaits, raWaitNanos, raWasted, errors        atomic.Int64
		wholeFiles, openLooked, prefetched, prefetchUsed, createsAsync atomic.Int64
		storedFiles, keptFiles                                         atomic.Int64
	}

	// stopLogged: a call failed because the mount is stopping (logged once).
	stopLogged atomic.Bool

	unmountOnce sync.Once
	unmountErr  error
}

// Mount serves the directory root of backend at mountpoint. The mount is
// ready when Mount returns. Call Unmount (or `ffkit fs umount`) to stop.
func Mount(backend fs.FS, root, mountpoint string, opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		backend: backend,
		root:    root,
		mnt:     mountpoint,
		opts:    opts,
		uid:     uint32(os.Getuid()),
		gid:     uint32(os.Getgid()),
		ctx:     ctx,
		cancel:  cancel,
		queue:   make(chan *readReq, 4*opts.MaxBatch),
		mc:      newMetaCache(opts.AttrTimeout),
		pf:      newPrefetcher(),
		pend:    newPendingOps(),
	}
	if rw, ok := backend.(fs.RandomAccessFS); ok {
		s.rw = rw
	}
	if s.opts.ReadAhead > 0 {
		n := max(1, int(opts.ReadAheadMemory/int64(opts.ReadAheadBlock)))
		s.raSem = make(chan struct{}, n)
	}
	s.nextIno.Store(autoIno)

	st, err := backend.Stat(ctx, root)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %s on %s: %w", ErrMount, root, backend, err)
	}
	if !st.IsDir {
		cancel()
		return nil, fmt.Errorf("%w: %s on %s is not a directory", ErrMount, root, backend)
	}
	if fi, err := os.Stat(mountpoint); err != nil || !fi.IsDir() {
		cancel()
		if err == nil {
			err = syscall.ENOTDIR
		}
		return nil, fmt.Errorf("%w: mount point %s: %w", ErrMount, mountpoint, err)
	}

	for range opts.Dispatchers {
		s.wg.Add(1)
		go s.dispatch()
	}

	ttl := max(opts.AttrTimeout, 0)
	fsName := opts.FsName
	if fsName == "" {
		fsName = backend.String() + ":" + root
	}
	mo := gofuse.MountOptions{
		AllowOther:               opts.AllowOther,
		MaxBackground:            opts.MaxBackground,
		MaxWrite:                 opts.MaxRequest,
		MaxReadAhead:             opts.MaxRequest,
		FsName:                   fsName,
		Name:                     "ffkit",
		ExplicitDataCacheControl: true, // no GETATTR before every read; open drops stale pages
		DisableSplice:            true, // replies come from Go memory; never bounded by the pipe size
		// O_TRUNC arrives with OPEN (a sequential-only backend can then
		// rewrite a file), and one large O_DIRECT read or write becomes
		// MaxRequest-sized requests sent in parallel.
		ExtraCapabilities: gofuse.CAP_ATOMIC_O_TRUNC | gofuse.CAP_ASYNC_DIO,
		Debug:             opts.Debug,
		Logger:            opts.Logger,
	}
	if opts.AllowOther {
		// Other users see the mount: the kernel then checks every access
		// against the modes and owners the mount reports (the mounting
		// user owns everything; files 0644, directories 0755), so another
		// user may read and list but not write, create, remove, rename or
		// chmod.
		mo.Options = append(mo.Options, "default_permissions")
	}
	if opts.ReadOnly {
		mo.Options = append(mo.Options, "ro")
	}
	rootNode := &node{srv: s}
	s.srv, err = gofs.Mount(mountpoint, rootNode, &gofs.Options{
		MountOptions:    mo,
		EntryTimeout:    &ttl,
		AttrTimeout:     &ttl,
		NegativeTimeout: &ttl,
		UID:             s.uid,
		GID:             s.gid,
		RootStableAttr:  &gofs.StableAttr{Ino: 1},
		// Mode 0000 is a mode (open(2) may create one): every reply
		// carries the real bits, so go-fuse must not fill in 0644.
		NullPermissions: true,
		Logger:          opts.Logger,
	})
	if err != nil {
		cancel()
		s.wg.Wait()
		return nil, fmt.Errorf("%w: %s: %w", ErrMount, mountpoint, err)
	}
	if opts.KernelReadAhead > 0 {
		if err := setKernelReadAhead(mountpoint, opts.KernelReadAhead); err != nil && opts.Debug {
			opts.Logger.Printf("kernel read-ahead stays the kernel's default: %v", err)
		}
	}
	return s, nil
}

// setKernelReadAhead sets the read_ahead_kb of the mount's backing device
// (a FUSE mount has its own, named by its anonymous device number). The
// kernel starts a FUSE mount at min(128 KiB, max_readahead): too little
// for a reader of whole files to find its next bytes already asked for.
func setKernelReadAhead(mountpoint string, bytes int) error {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return fmt.Errorf("stat %s: %w", mountpoint, err)
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(fmt.Sprintf("%d\n", max(bytes/1024, 4))), 0); err != nil {
		return fmt.Errorf("set %s: %w", p, err)
	}
	return nil
}

// Mountpoint is where the file system is mounted.
func (s *Server) Mountpoint() string { return s.mnt }

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{
		Reads: s.stats.reads.Load(), ReadBytes: s.stats.readBytes.Load(),
		Writes: s.stats.writes.Load(), WriteBytes: s.stats.writeBytes.Load(),
		Batches: s.stats.batches.Load(), BatchedReads: s.stats.batchedReads.Load(),
		ReadAheadHits: s.stats.raHits.Load(), ReadAheadBytes: s.stats.raBytes.Load(),
		ReadAheadWaits:       s.stats.raWaits.Load(),
		ReadAheadWaitSeconds: time.Duration(s.stats.raWaitNanos.Load()).Seconds(),
		ReadAheadWasted:      s.stats.raWasted.Load(),
		ReadAheadHeld:        int64(len(s.raSem)),
		WholeFiles:           s.stats.wholeFiles.Load(),
		StoredFiles:          s.stats.storedFiles.Load(),
		KeptFiles:            s.stats.keptFiles.Load(),
		OpensFromLookup:      s.stats.openLooked.Load(),
		FilesPrefetched:      s.stats.prefetched.Load(),
		PrefetchesUsed:       s.stats.prefetchUsed.Load(),
		CreatesAsync:         s.stats.createsAsync.Load(),
		Errors:               s.stats.errors.Load(),
		MetaCache:            s.mc.stats(),
	}
}

// Wait blocks until the file system is unmounted (by Unmount, by
// `ffkit fs umount`, by fusermount3 -u) and its goroutines have stopped.
func (s *Server) Wait() {
	s.srv.Wait()
	s.cancel()
	s.pf.close()
	s.wg.Wait()
}

// UnmountGrace is how long Unmount waits for the users of a busy,
// detached mount to close their files.
var UnmountGrace = 5 * time.Second

// Unmount unmounts the file system and waits for its goroutines. If the
// mount is busy (a process has its working directory or a file open in
// it), it is detached lazily: it disappears from the namespace at once and
// is released when the last user leaves; Unmount waits UnmountGrace for
// that and then returns an error saying so.
func (s *Server) Unmount() error {
	s.unmountOnce.Do(func() {
		err := s.srv.Unmount()
		if err == nil {
			s.cancel()
			s.pf.close()
			s.srv.Wait()
			s.wg.Wait()
			return
		}
		// Busy: detach it so that no new caller enters, then stop serving.
		if lerr := lazyUnmount(s.mnt); lerr != nil {
			s.unmountErr = fmt.Errorf("unmount %s: %w (lazy unmount: %v)", s.mnt, err, lerr)
		}
		s.cancel()
		s.pf.close()
		s.wg.Wait()
		// The kernel keeps a detached mount until its last open file is
		// closed. Give its users a moment; then stop waiting: when this
		// process exits, their calls fail with ENOTCONN instead of hanging.
		done := make(chan struct{})
		go func() { s.srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(UnmountGrace):
			if s.unmountErr == nil {
				s.unmountErr = fmt.Errorf("unmount %s: detached, but files are still open in it after %v: %w",
					s.mnt, UnmountGrace, err)
			}
		}
	})
	return s.unmountErr
}

// Unmount unmounts the FUSE file system at mountpoint from outside the
// serving process (as `fusermount3 -u`); the serving process then exits.
// With lazy, a busy mount is detached instead of failing with EBUSY.
func Unmount(mountpoint string, lazy bool) error {
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		bin, err = exec.LookPath("fusermount")
	}
	if err == nil {
		out, err := exec.Command(bin, append(args, mountpoint)...).CombinedOutput()
		if err == nil {
			return nil
		}
		msg := strings.TrimSpace(string(out))
		if os.Geteuid() != 0 {
			if strings.Contains(strings.ToLower(msg), "busy") {
				err = syscall.EBUSY // so callers can tell with errors.Is
			}
			return fmt.Errorf("unmount %s: %s: %w", mountpoint, msg, err)
		}
	}
	// Root without fusermount (or fusermount refused): umount(2) directly.
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	if err := syscall.Unmount(mountpoint, flags); err != nil {
		return fmt.Errorf("unmount %s: %w", mountpoint, err)
	}
	return nil
}

func lazyUnmount(mnt string) error { return Unmount(mnt, true) }

// IsMounted reports whether mountpoint is a FUSE mount of ffkit, from
// /proc/self/mountinfo.
func IsMounted(mountpoint string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	want := path.Clean(mountpoint)
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		if unescapeMount(f[4]) != want {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) && strings.HasPrefix(f[i+1], "fuse") {
				return true
			}
		}
	}
	return false
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// backendPath is the backend path of rel, a slash path relative to the mount.
func (s *Server) backendPath(rel string) string {
	if rel == "" {
		return s.root
	}
	return path.Join(s.root, rel)
}

// opContext bounds one backend call.
func (s *Server) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, s.opts.Timeout)
}

// bounded runs fn, a backend call that takes no context, under the
// operation deadline: past it the caller gets ETIMEDOUT while fn finishes
// (or fails) on its own. The goroutine is the backend's to end; the
// backends bound their own calls (the cluster client's retry budget).
func (s *Server) bounded(fn func() error) error {
	ctx, cancel := s.opContext()
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("fuse: storage call: %w", ctx.Err())
	}
}

// errno counts and maps an error.
func (s *Server) errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	s.stats.errors.Add(1)
	en := Errno(err)
	if en == syscall.EINTR {
		// The mount's storage calls run under its own context, never the
		// caller's request: a canceled call means the mount is stopping
		// (or the storage gave up), not that the caller was interrupted.
		// EINTR would make callers that retry it (Go's os package does)
		// spin on the dying mount; answer as a gone mount does.
		en = syscall.EIO
		if s.ctx.Err() != nil {
			en = syscall.ENOTCONN
			if s.stopLogged.Swap(true) {
				return en // said once below
			}
		}
	}
	switch en {
	case syscall.ENOENT, syscall.EEXIST, syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR,
		syscall.ENODATA, syscall.ENAMETOOLONG, syscall.EPERM:
		// Normal answers: the caller asked about something that is not so.
	default:
		// The caller sees only the errno: keep the cause for the operator.
		s.opts.Logger.Printf("%v: %v", en, err)
	}
	return en
}

var errClosed = errors.New("fuse: file system unmounted")
