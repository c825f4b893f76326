package main

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/clusterfs"
	_ "github.com/ffkit/ffkit/fs/clusterfs" // ffkit:// paths everywhere
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/internal/units"
)

func init() {
	registerFS(newFSLsCmd)
	registerFS(newFSStatCmd)
	registerFS(newFSMkdirCmd)
	registerFS(newFSPutCmd)
	registerFS(newFSGetCmd)
	registerFS(newFSRmCmd)
	registerFS(newFSMvCmd)
	registerFS(newFSDfCmd)
}

// tokenFlag adds --token-file to a file command; the token is handed to
// the ffkit:// opener through FFKIT_TOKEN.
func tokenFlag(c *cobra.Command) *string {
	var tf string
	c.Flags().StringVar(&tf, "token-file", "", "file holding the cluster token (default $FFKIT_TOKEN, then the user's token file)")
	return &tf
}

func resolvePath(ctx context.Context, tokenFile, p string) (fs.FS, string, error) {
	if tokenFile != "" {
		t, err := client.ReadTokenFile(tokenFile)
		if err != nil {
			return nil, "", errkind.Wrap(errkind.Usage, err)
		}
		os.Setenv("FFKIT_TOKEN", t)
		if b, err := client.TrustBesideTokenFile(tokenFile); err != nil {
			return nil, "", err
		} else if b != nil && os.Getenv("FFKIT_TLS_DIR") == "" {
			os.Setenv("FFKIT_TLS_DIR", b.Dir)
		}
	}
	return fs.Resolve(ctx, p)
}

// statPath resolves the path argument arg (as resolvePath) and stats it,
// for ls and stat; a missing path is a data error (exit 1) naming arg.
func statPath(ctx context.Context, tokenFile, arg string) (fs.FS, string, fs.FileInfo, error) {
	f, p, err := resolvePath(ctx, tokenFile, arg)
	if err != nil {
		return nil, "", fs.FileInfo{}, err
	}
	st, err := f.Stat(ctx, p)
	if err != nil {
		return nil, "", fs.FileInfo{}, notFound(arg, err)
	}
	return f, p, st, nil
}

// fileRow is one line of ls and stat.
type fileRow struct {
	Path string `json:"path"`
	// Mode is ls -l's mode string ("drwxr-xr-x").
	Mode string `json:"mode"`
	fs.FileInfo
}

func newFileRow(p string, fi fs.FileInfo) fileRow {
	return fileRow{Path: p, Mode: modeString(fi), FileInfo: fi}
}

func printRows(rows []fileRow) error {
	if jsonOut {
		if rows == nil {
			rows = []fileRow{}
		}
		return printJSON(rows)
	}
	names := map[[2]uint32]string{}
	for _, r := range rows {
		owner, group := "-", "-"
		if r.HasOwner {
			owner, group = ownerNames(names, r.Uid, r.Gid)
		}
		fmt.Fprintf(human(), "%s %-8s %-8s %12d %s %s\n", modeString(r.FileInfo), owner, group, r.Size, r.ModTime.UTC().Format("2006-01-02 15:04:05"), r.Path)
	}
	return nil
}

// ownerNames names uid and gid as this machine's user and group database
// does (the number when it has no name), caching the answers in names.
func ownerNames(names map[[2]uint32]string, uid, gid uint32) (string, string) {
	u, ok := names[[2]uint32{0, uid}]
	if !ok {
		u = strconv.FormatUint(uint64(uid), 10)
		if x, err := user.LookupId(u); err == nil {
			u = x.Username
		}
		names[[2]uint32{0, uid}] = u
	}
	g, ok := names[[2]uint32{1, gid}]
	if !ok {
		g = strconv.FormatUint(uint64(gid), 10)
		if x, err := user.LookupGroupId(g); err == nil {
			g = x.Name
		}
		names[[2]uint32{1, gid}] = g
	}
	return u, g
}

// modeString is ls -l's mode of fi: the kind (d directory, l symlink, p
// FIFO, s socket, c and b devices, - file), then the permission bits with
// setuid, setgid and sticky as s/S and t/T. Without stored permission
// bits (HasOwner false) it shows the defaults a mount reports (0755
// directories, 0644 others).
func modeString(fi fs.FileInfo) string {
	kind := map[fs.Kind]byte{fs.KindSymlink: 'l', fs.KindFIFO: 'p', fs.KindSocket: 's', fs.KindChar: 'c', fs.KindBlock: 'b'}[fi.Kind]
	perm := uint32(0o644)
	switch {
	case kind != 0:
	case fi.IsDir:
		kind, perm = 'd', 0o755
	default:
		kind = '-'
	}
	if fi.HasOwner {
		perm = fi.Perm
	}
	b := []byte{kind}
	for _, who := range []uint32{6, 3, 0} {
		bits := perm >> who & 7
		for j, c := range "rwx" {
			if bits&(4>>j) == 0 {
				c = '-'
			}
			b = append(b, byte(c))
		}
	}
	for i, bit := range []uint32{0o4000, 0o2000, 0o1000} { // setuid, setgid, sticky
		if perm&bit == 0 {
			continue
		}
		at := 3 + 3*i
		b[at] = map[bool]byte{true: "sst"[i], false: "SST"[i]}[b[at] == 'x']
	}
	return string(b)
}

func notFound(p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errkind.Wrap(errkind.Data, fmt.Errorf("%s: no such file or directory", p))
	}
	return err
}

func newFSLsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ls PATH",
		Short: "List a directory (or describe a file) on ffkit:// or local paths",
		Long: `List a directory: one line per entry, as ls -l: the mode (kind d, l, p, s,
c, b or -, then the permission bits), owner, group, size in bytes,
modification time UTC, path. Owner and group are "-" for entries that store
none (a mount shows them with its own user and the default modes shown).
With --json: [{"path","mode","name","size","is_dir","mod_time","perm","uid",
"gid","has_owner","kind","nlink","ino","atime","ctime"}] (absent fields are
zero). Exit 1 if PATH does not exist.`,
		Args: cobra.ExactArgs(1),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		f, p, st, err := statPath(ctx, *tf, args[0])
		if err != nil {
			return err
		}
		if !st.IsDir {
			return printRows([]fileRow{newFileRow(args[0], st)})
		}
		infos, err := f.List(ctx, p)
		if err != nil {
			return notFound(args[0], err)
		}
		rows := make([]fileRow, len(infos))
		for i, fi := range infos {
			rows[i] = newFileRow(fs.Join(args[0], fi.Name), fi)
		}
		return printRows(rows)
	}
	return c
}

func newFSStatCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "stat PATH",
		Short: "Describe a file or directory; exit 1 if it does not exist",
		Args:  cobra.ExactArgs(1),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		_, _, st, err := statPath(cmd.Context(), *tf, args[0])
		if err != nil {
			return err
		}
		if jsonOut {
			return printJSON(newFileRow(args[0], st))
		}
		return printRows([]fileRow{newFileRow(args[0], st)})
	}
	return c
}

func newFSMkdirCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "mkdir PATH...",
		Short: "Create directories and their missing parents",
		Args:  cobra.MinimumNArgs(1),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		for _, a := range args {
			f, p, err := resolvePath(ctx, *tf, a)
			if err != nil {
				return err
			}
			if err := f.MkdirAll(ctx, p); err != nil {
				return err
			}
		}
		return nil
	}
	return c
}

func newFSRmCmd() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm PATH...",
		Short: "Remove files and empty directories (-r: directories with their contents)",
		Long: `Remove files and empty directories; with -r, directories and everything in
them. The space of removed files is reclaimed in the background by the
metadata servers' garbage collector. Exit 1 if a PATH does not exist.`,
		Args: cobra.MinimumNArgs(1),
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		for _, a := range args {
			f, p, err := resolvePath(ctx, *tf, a)
			if err != nil {
				return err
			}
			if recursive {
				err = removeAll(ctx, f, p)
			} else {
				err = f.Remove(ctx, p)
			}
			if err != nil {
				return notFound(a, err)
			}
		}
		return nil
	}
	return c
}

func removeAll(ctx context.Context, f fs.FS, p string) error {
	st, err := f.Stat(ctx, p)
	if err != nil {
		return err
	}
	if st.IsDir {
		kids, err := f.List(ctx, p)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := removeAll(ctx, f, fs.Join(p, k.Name)); err != nil {
				return err
			}
		}
	}
	return f.Remove(ctx, p)
}

func newFSMvCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "mv SRC DST",
		Short: "Rename a file or directory atomically (replacing a file at DST)",
		Long: `Rename SRC to DST atomically, within one file system. An existing file at
DST is replaced; an existing directory at DST must be empty. A directory
cannot move under itself.`,
		Args: cobra.ExactArgs(2),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		sf, sp, err := resolvePath(ctx, *tf, args[0])
		if err != nil {
			return err
		}
		df, dp, err := resolvePath(ctx, *tf, args[1])
		if err != nil {
			return err
		}
		if sf != df {
			return usagef("mv: %s and %s are on different file systems (use put/get)", args[0], args[1])
		}
		return notFound(args[0], sf.Rename(ctx, sp, dp))
	}
	return c
}

// copyStats counts a put or get.
type copyStats struct {
	mu      sync.Mutex
	Files   int     `json:"files"`
	Dirs    int     `json:"dirs"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// copyTree copies src (a file or directory tree) to dst. If dst is an
// existing directory, src goes inside it under its base name.
func copyTree(ctx context.Context, sf fs.FS, sp string, df fs.FS, dp string, parallel int) (*copyStats, error) {
	st, err := sf.Stat(ctx, sp)
	if err != nil {
		return nil, err
	}
	// cp -r's convention: into an existing directory under SRC's name;
	// else DST is the copy, and its parent must exist.
	if dst, err := df.Stat(ctx, dp); err == nil && dst.IsDir {
		dp = fs.Join(dp, path.Base(strings.TrimSuffix(filepath.ToSlash(sp), "/")))
	} else if err != nil {
		parent := path.Dir(strings.TrimSuffix(filepath.ToSlash(dp), "/"))
		if pst, perr := df.Stat(ctx, parent); perr != nil || !pst.IsDir {
			return nil, &missingParentError{parent: parent, err: fs.ErrNotExist}
		}
	}
	stats := &copyStats{}
	start := time.Now()
	var total int64
	type job struct {
		s, d string
		fi   fs.FileInfo // the source's
	}
	var jobs, dirs []job
	var walk func(s, d string, fi fs.FileInfo) error
	walk = func(s, d string, fi fs.FileInfo) error {
		if !fi.IsDir {
			jobs = append(jobs, job{s, d, fi})
			total += fi.Size
			return nil
		}
		if err := df.MkdirAll(ctx, d); err != nil {
			return err
		}
		stats.Dirs++
		dirs = append(dirs, job{s, d, fi})
		kids, err := sf.List(ctx, s)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := walk(fs.Join(s, k.Name), fs.Join(d, k.Name), k); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(sp, dp, st); err != nil {
		return nil, err
	}
	bar := newProgress(total, "copy")
	defer bar.Finish()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for _, j := range jobs {
		g.Go(func() error {
			n, err := copyFile(gctx, sf, j.s, df, j.d, func(n int) { bar.Add(n) })
			if err != nil {
				return err
			}
			if err := keepAttrs(gctx, df, j.d, j.fi); err != nil {
				return err
			}
			stats.mu.Lock()
			stats.Files++
			stats.Bytes += n
			stats.mu.Unlock()
			return nil
		})
	}
	err = g.Wait()
	// Directories last (their files changed their times), deepest first.
	for i := len(dirs) - 1; i >= 0 && err == nil; i-- {
		err = keepAttrs(ctx, df, dirs[i].d, dirs[i].fi)
	}
	stats.Seconds = time.Since(start).Seconds()
	return stats, err
}

// keepAttrs gives the copy dp the modification time, permission bits and
// owner of its source (fi), as cp -a does, where df stores them: an owner
// that the caller may not give (not root, on local disk) is left out.
func keepAttrs(ctx context.Context, df fs.FS, dp string, fi fs.FileInfo) error {
	as, ok := df.(fs.AttrSetter)
	if !ok {
		return nil
	}
	c := fs.AttrChange{MTime: &fi.ModTime}
	if fi.HasOwner {
		c.Perm = &fi.Perm
		c.Uid, c.Gid = &fi.Uid, &fi.Gid
	}
	_, err := as.SetAttr(ctx, dp, c)
	if errors.Is(err, iofs.ErrPermission) && c.Uid != nil {
		c.Uid, c.Gid = nil, nil
		_, err = as.SetAttr(ctx, dp, c)
	}
	if err != nil {
		return fmt.Errorf("keep the mode and times of %s: %w", dp, err)
	}
	return nil
}

// missingParentError: the destination of a copy does not exist and
// neither does its parent directory.
type missingParentError struct {
	parent string
	err    error
}

func (e *missingParentError) Error() string { return e.parent + ": no such directory" }
func (e *missingParentError) Unwrap() error { return e.err }

const copyBlock = 4 << 20

// copyFile copies one file, reading batches of blocks with ReadBatch and
// publishing the destination atomically.
func copyFile(ctx context.Context, sf fs.FS, sp string, df fs.FS, dp string, progress func(int)) (int64, error) {
	r, err := sf.Open(ctx, sp, fs.OpenOptions{})
	if err != nil {
		return 0, err
	}
	defer r.Close()
	w, err := df.Create(ctx, dp)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	size := r.Size()
	const perBatch = 8
	bufs := make([][]byte, perBatch)
	for i := range bufs {
		bufs[i] = make([]byte, copyBlock)
	}
	for off := int64(0); off < size; {
		var reqs []fs.ReadRequest
		for i := 0; i < perBatch && off < size; i++ {
			n := min(int64(copyBlock), size-off)
			reqs = append(reqs, fs.ReadRequest{File: r, Off: off, Buf: bufs[i][:n]})
			off += n
		}
		if err := sf.ReadBatch(ctx, reqs); err != nil {
			return 0, fmt.Errorf("read %s: %w", sp, err)
		}
		for _, q := range reqs {
			if _, err := w.Write(q.Buf); err != nil {
				return 0, fmt.Errorf("write %s: %w", dp, err)
			}
			progress(len(q.Buf))
		}
	}
	if err := w.Commit(); err != nil {
		return 0, fmt.Errorf("commit %s: %w", dp, err)
	}
	return size, nil
}

func newCopyCmd(use, short, long string) *cobra.Command {
	var parallel int
	c := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.ExactArgs(2)}
	c.Flags().IntVar(&parallel, "parallel", 4, "files copied at once")
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if parallel < 1 {
			return usagef("--parallel must be at least 1")
		}
		ctx := cmd.Context()
		sf, sp, err := resolvePath(ctx, *tf, args[0])
		if err != nil {
			return err
		}
		df, dp, err := resolvePath(ctx, *tf, args[1])
		if err != nil {
			return err
		}
		st, err := copyTree(ctx, sf, sp, df, dp, parallel)
		var mp *missingParentError
		if errors.As(err, &mp) {
			p := strings.TrimSuffix(args[1], "/")
			parent := p[:max(strings.LastIndexByte(p, '/'), 0)]
			return errkind.Wrap(errkind.Data, fmt.Errorf("%s: its parent directory %s does not exist (as cp -r, the copy goes to an existing directory or becomes a new entry of one): create it first with 'ffkit fs mkdir %s' (or 'mkdir -p' for a local path): %w",
				args[1], parent, parent, mp.err))
		}
		if errors.Is(err, fs.ErrNotExist) {
			return errkind.Wrap(errkind.Data, err) // exit 1; the message names the path
		}
		if err != nil {
			return err
		}
		if jsonOut {
			return printJSON(st)
		}
		fmt.Fprintf(human(), "%d files, %d directories, %d bytes in %.2fs (%.1f MiB/s)\n", st.Files, st.Dirs, st.Bytes, st.Seconds, units.MiBPerS(st.Bytes, st.Seconds))
		return nil
	}
	return c
}

func newFSPutCmd() *cobra.Command {
	return newCopyCmd("put LOCAL REMOTE", "Copy a local file or directory tree onto the cluster",
		`Copy LOCAL (a file, or a directory with everything in it) to REMOTE
(ffkit://HOST:PORT/path), as cp -r does: if REMOTE is an existing
directory, LOCAL goes inside it under its own name; otherwise REMOTE becomes
the copy, and its parent directory must exist (create it with 'ffkit fs
mkdir'). Each file is published atomically when it is complete; files and
directories keep their modification time, permission bits and owner (as
cp -a). With --json: {"files","dirs","bytes","seconds"}.`)
}

func newFSGetCmd() *cobra.Command {
	return newCopyCmd("get REMOTE LOCAL", "Copy a file or directory tree from the cluster to local disk",
		`Copy REMOTE (ffkit://HOST:PORT/path: a file, or a directory with everything
in it) to LOCAL, as cp -r does: if LOCAL is an existing directory, REMOTE
goes inside it under its own name; otherwise LOCAL becomes the copy, and
its parent directory must exist. Each file is written under a temporary name and renamed
when complete. Files and directories keep their modification time and
permission bits, and their owner when run as root (as cp -a). With --json: {"files","dirs","bytes","seconds"}.`)
}

// dfTarget is one row of df: a storage target's space as its storage
// service last reported it to mgmtd (every heartbeat).
type dfTarget struct {
	ID    proto.TargetID    `json:"target"`
	Node  proto.NodeID      `json:"node"`
	Addr  string            `json:"addr"`
	Chain proto.ChainID     `json:"chain"` // 0: in no chain
	State proto.PublicState `json:"state"`
	// Capacity and Free are the target's file system's (0: not reported).
	Capacity int64 `json:"capacity_bytes"`
	// Used is the bytes of chunk data the target holds (committed).
	Used int64 `json:"used_bytes"`
	Free int64 `json:"free_bytes"`
	// UsePct is the file system's fill as df(1) computes it: used / (used + free),
	// the whole file system's use, not only ffkit's chunks.
	UsePct float64 `json:"use_pct"`
	FS     string  `json:"fs,omitempty"`
	// AgeSec is how old the report is (seconds); -1 if none was received.
	AgeSec float64 `json:"age_s"`
}

type dfReport struct {
	Cluster string `json:"cluster"`
	Files   int    `json:"files"` // published files (from the metadata)
	Bytes   int64  `json:"bytes"` // their logical bytes
	// Totals over targets. Capacity and Free count each file system once
	// (targets sharing a disk report the same one); Used sums the targets.
	Capacity int64      `json:"capacity_bytes"`
	Used     int64      `json:"used_bytes"`
	Free     int64      `json:"free_bytes"`
	UsePct   float64    `json:"use_pct"`
	Targets  []dfTarget `json:"targets"` // by chain, then chain order
}

func newFSDfCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "df ffkit://HOST:PORT",
		Short: "Show the capacity and use of every storage target of a cluster",
		Long: `Show, for every storage target: its id, node, chain, state, the capacity of
its file system, the bytes its chunks use, the bytes free, and the file
system's use% (df(1)'s: used / (used + available)); then the totals.
Storage services measure their targets (statfs) and report them to mgmtd in
every heartbeat, so the figures are at most a heartbeat old. Total capacity
and free count each file system once (targets on one host sharing a disk,
whether one storage process or several serve them); total used sums the
targets' chunk data (every replica counts). USE% is df(1)'s: the file
system's used blocks over used plus available, rounded up; a mount of the
cluster reports the same capacity and free space to df(1). The file count and
logical bytes come from the metadata (published files).
With --json: {"cluster","files","bytes","capacity_bytes","used_bytes",
"free_bytes","use_pct","targets":[{"target","node","addr","chain","state",
"capacity_bytes","used_bytes","free_bytes","use_pct","fs","age_s"}]}.`,
		Args: cobra.ExactArgs(1),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		u := args[0]
		if !strings.HasPrefix(u, "ffkit://") {
			return usagef("df needs a cluster URL ffkit://HOST:PORT, got %q", u)
		}
		f, _, err := resolvePath(ctx, *tf, u)
		if err != nil {
			return err
		}
		cf, ok := f.(*clusterfs.FS)
		if !ok {
			return usagef("%s is not an ffkit cluster", u)
		}
		rep, err := diskUse(ctx, cf)
		if err != nil {
			return err
		}
		if jsonOut {
			return printJSON(rep)
		}
		w := human()
		fmt.Fprintf(w, "%-7s %-5s %-6s %-8s %10s %10s %10s %5s\n", "TARGET", "NODE", "CHAIN", "STATE", "CAPACITY", "USED", "FREE", "USE%")
		for _, t := range rep.Targets {
			fmt.Fprintf(w, "%-7d %-5d %-6d %-8s %10s %10s %10s %5s\n", t.ID, t.Node, t.Chain, t.State, dfSize(t.Capacity), dfBytes(t.Used), dfSize(t.Free), dfPct(t.Capacity, t.UsePct))
		}
		fmt.Fprintf(w, "%-7s %-5s %-6s %-8s %10s %10s %10s %5s\n", "total", "", "", "", dfSize(rep.Capacity), dfBytes(rep.Used), dfSize(rep.Free), dfPct(rep.Capacity, rep.UsePct))
		fmt.Fprintf(w, "%d files, %s logical\n", rep.Files, dfBytes(rep.Bytes))
		return nil
	}
	return c
}

func dfBytes(n int64) string { return strings.ReplaceAll(dfHuman(n), " ", "") }

func dfSize(n int64) string {
	if n <= 0 {
		return "-"
	}
	return dfBytes(n)
}

func dfPct(capacity int64, pct float64) string {
	if capacity <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", math.Ceil(pct))
}

// dfHuman formats n bytes with a binary unit (B, KiB, MiB, GiB, TiB).
func dfHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	for f /= unit; f >= unit && u < len(units)-1; f /= unit {
		u++
	}
	return fmt.Sprintf("%.1f %s", f, units[u])
}

// diskUse counts the published files and their bytes (walking the
// namespace) and asks mgmtd for every target's space.
func diskUse(ctx context.Context, f *clusterfs.FS) (*dfReport, error) {
	rep := &dfReport{Cluster: f.String(), Targets: []dfTarget{}}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	var walk func(dir string) error
	walk = func(dir string) error {
		es, err := f.Meta().Readdir(gctx, dir)
		if err != nil {
			return err
		}
		for _, e := range es {
			p := path.Join(dir, e.Name)
			if e.IsDir {
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			g.Go(func() error {
				n, err := f.Meta().StatInode(gctx, e.Inode)
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed meanwhile
				}
				if err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				rep.Files++
				rep.Bytes += n.Size
				return nil
			})
		}
		return nil
	}
	if err := walk("/"); err != nil {
		g.Wait()
		return nil, err
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	st, err := f.Chunks().Status(ctx)
	if err != nil {
		return nil, err
	}
	r := st.Routing
	space := map[proto.TargetID]proto.TargetUsage{}
	for _, u := range st.Targets {
		space[u.ID] = u
	}
	row := func(id proto.TargetID, node proto.NodeID, chain proto.ChainID, state proto.PublicState) dfTarget {
		t := dfTarget{ID: id, Node: node, Addr: r.NodeAddr(node), Chain: chain, State: state, AgeSec: -1}
		if u, ok := space[id]; ok {
			t.Capacity, t.Used, t.Free, t.FS = u.Capacity, u.Used, u.Free, u.FS
			t.AgeSec = time.Since(time.Unix(0, u.Reported)).Seconds()
			fsUsed := u.FSUsed
			if fsUsed <= 0 {
				fsUsed = u.Capacity - u.Free
			}
			t.UsePct = dfUsePct(fsUsed, u.Free)
		}
		return t
	}
	inChain := map[proto.TargetID]bool{}
	for _, ch := range r.Chains {
		for _, t := range ch.Targets {
			inChain[t.ID] = true
			rep.Targets = append(rep.Targets, row(t.ID, t.Node, ch.ID, t.State))
		}
	}
	for _, u := range st.Targets {
		if !inChain[u.ID] {
			rep.Targets = append(rep.Targets, row(u.ID, u.Node, 0, ""))
		}
	}
	sort.SliceStable(rep.Targets, func(i, j int) bool { return rep.Targets[i].Chain < rep.Targets[j].Chain })
	for _, t := range rep.Targets {
		rep.Used += t.Used
	}
	// Each file system once, as the mount's statfs reports it.
	sum := clusterfs.SumSpace(r, st.Targets)
	rep.Capacity, rep.Free = sum.Total, sum.Free
	rep.UsePct = dfUsePct(sum.Used, sum.Free)
	return rep, nil
}

// dfUsePct is df(1)'s use%: used / (used + available), where used counts
// the file system's blocks in use and the reserved blocks count in neither.
// df rounds it up; dfPct prints it so.
func dfUsePct(used, avail int64) float64 {
	if used+avail <= 0 {
		return 0
	}
	return 100 * float64(used) / float64(used+avail)
}
