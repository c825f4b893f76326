package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
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
	}
	return fs.Resolve(ctx, p)
}

// fileRow is one line of ls and stat.
type fileRow struct {
	Path string `json:"path"`
	fs.FileInfo
}

func printRows(rows []fileRow) error {
	if jsonOut {
		if rows == nil {
			rows = []fileRow{}
		}
		return printJSON(rows)
	}
	for _, r := range rows {
		kind := "-"
		if r.IsDir {
			kind = "d"
		}
		fmt.Fprintf(human(), "%s %12d %s %s\n", kind, r.Size, r.ModTime.UTC().Format("2006-01-02 15:04:05"), r.Path)
	}
	return nil
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
		Long: `List a directory: one line per entry (d for directories, size in bytes,
modification time UTC, path). With --json: [{"path","name","size","is_dir","mod_time"}].
Exit 1 if PATH does not exist.`,
		Args: cobra.ExactArgs(1),
	}
	tf := tokenFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		f, p, err := resolvePath(ctx, *tf, args[0])
		if err != nil {
			return err
		}
		st, err := f.Stat(ctx, p)
		if err != nil {
			return notFound(args[0], err)
		}
		if !st.IsDir {
			return printRows([]fileRow{{Path: args[0], FileInfo: st}})
		}
		infos, err := f.List(ctx, p)
		if err != nil {
			return notFound(args[0], err)
		}
		rows := make([]fileRow, len(infos))
		for i, fi := range infos {
			rows[i] = fileRow{Path: fs.Join(args[0], fi.Name), FileInfo: fi}
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
		ctx := cmd.Context()
		f, p, err := resolvePath(ctx, *tf, args[0])
		if err != nil {
			return err
		}
		st, err := f.Stat(ctx, p)
		if err != nil {
			return notFound(args[0], err)
		}
		if jsonOut {
			return printJSON(fileRow{Path: args[0], FileInfo: st})
		}
		return printRows([]fileRow{{Path: args[0], FileInfo: st}})
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
	if dst, err := df.Stat(ctx, dp); err == nil && dst.IsDir {
		dp = fs.Join(dp, path.Base(strings.TrimSuffix(filepath.ToSlash(sp), "/")))
	}
	stats := &copyStats{}
	start := time.Now()
	var total int64
	type job struct{ s, d string }
	var jobs []job
	var walk func(s, d string, isDir bool, size int64) error
	walk = func(s, d string, isDir bool, size int64) error {
		if !isDir {
			jobs = append(jobs, job{s, d})
			total += size
			return nil
		}
		if err := df.MkdirAll(ctx, d); err != nil {
			return err
		}
		stats.Dirs++
		kids, err := sf.List(ctx, s)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := walk(fs.Join(s, k.Name), fs.Join(d, k.Name), k.IsDir, k.Size); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(sp, dp, st.IsDir, st.Size); err != nil {
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
			stats.mu.Lock()
			stats.Files++
			stats.Bytes += n
			stats.mu.Unlock()
			return nil
		})
	}
	err = g.Wait()
	stats.Seconds = time.Since(start).Seconds()
	return stats, err
}

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
		if errors.Is(err, fs.ErrNotExist) {
			return errkind.Wrap(errkind.Data, err) // exit 1; the message names the path
		}
		if err != nil {
			return err
		}
		if jsonOut {
			return printJSON(st)
		}
		mbs := 0.0
		if st.Seconds > 0 {
			mbs = float64(st.Bytes) / st.Seconds / 1e6
		}
		fmt.Fprintf(human(), "%d files, %d directories, %d bytes in %.2fs (%.1f MB/s)\n", st.Files, st.Dirs, st.Bytes, st.Seconds, mbs)
		return nil
	}
	return c
}

func newFSPutCmd() *cobra.Command {
	return newCopyCmd("put LOCAL REMOTE", "Copy a local file or directory tree onto the cluster",
		`Copy LOCAL (a file, or a directory with everything in it) to REMOTE
(ffkit://HOST:PORT/path). If REMOTE is an existing directory, LOCAL goes
inside it under its own name. Each file is published atomically when it is
complete. With --json: {"files","dirs","bytes","seconds"}.`)
}

func newFSGetCmd() *cobra.Command {
	return newCopyCmd("get REMOTE LOCAL", "Copy a file or directory tree from the cluster to local disk",
		`Copy REMOTE (ffkit://HOST:PORT/path: a file, or a directory with everything
in it) to LOCAL. If LOCAL is an existing directory, REMOTE goes inside it
under its own name. Each file is written under a temporary name and renamed
when complete. With --json: {"files","dirs","bytes","seconds"}.`)
}

// dfTarget is one row of df.
type dfTarget struct {
	Chain proto.ChainID     `json:"chain"`
	ID    proto.TargetID    `json:"target"`
	Node  proto.NodeID      `json:"node"`
	Addr  string            `json:"addr"`
	State proto.PublicState `json:"state"`
	// Used is the file bytes stored on this target (every target of a
	// chain holds the same chunks).
	Used int64 `json:"used_bytes"`
}

type dfReport struct {
	Cluster string     `json:"cluster"`
	Files   int        `json:"files"`
	Bytes   int64      `json:"bytes"`   // logical file bytes
	Stored  int64      `json:"stored"`  // bytes on all targets (bytes x replicas)
	Targets []dfTarget `json:"targets"` // per target, in chain order
	Note    string     `json:"note,omitempty"`
}

func newFSDfCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "df ffkit://HOST:PORT",
		Short: "Show the use of every storage target of a cluster",
		Long: `Show, for every storage target (in chain order), its chain, node, address,
state and the file bytes it holds, with the totals: files, logical bytes and
stored bytes (logical x replicas). The use is computed from the metadata
(every file's length and layout), so it counts published files only.
With --json: {"cluster","files","bytes","stored","targets":[{"chain",
"target","node","addr","state","used_bytes"}]}.`,
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
		fmt.Fprintf(w, "%-6s %-7s %-5s %-22s %-8s %14s\n", "CHAIN", "TARGET", "NODE", "ADDR", "STATE", "USED")
		for _, t := range rep.Targets {
			fmt.Fprintf(w, "%-6d %-7d %-5d %-22s %-8s %14d\n", t.Chain, t.ID, t.Node, t.Addr, t.State, t.Used)
		}
		fmt.Fprintf(w, "%d files, %d bytes, %d bytes stored on all targets\n", rep.Files, rep.Bytes, rep.Stored)
		return nil
	}
	return c
}

// diskUse walks the namespace and sums every file's chunk bytes per chain.
func diskUse(ctx context.Context, f *clusterfs.FS) (*dfReport, error) {
	rep := &dfReport{Cluster: f.String(), Targets: []dfTarget{}}
	perChain := map[proto.ChainID]int64{}
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
				if l := n.Layout; l != nil && l.ChunkSize > 0 && len(l.Chains) > 0 {
					for idx := int64(0); idx*l.ChunkSize < n.Size; idx++ {
						perChain[l.Chain(uint64(idx))] += min(l.ChunkSize, n.Size-idx*l.ChunkSize)
					}
				}
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
	r := f.Chunks().Routing()
	for _, ch := range r.Chains {
		for _, t := range ch.Targets {
			rep.Targets = append(rep.Targets, dfTarget{Chain: ch.ID, ID: t.ID, Node: t.Node, Addr: r.NodeAddr(t.Node), State: t.State, Used: perChain[ch.ID]})
			rep.Stored += perChain[ch.ID]
		}
	}
	sort.SliceStable(rep.Targets, func(i, j int) bool { return rep.Targets[i].Chain < rep.Targets[j].Chain })
	rep.Note = "capacity is not reported: storage services do not publish their free space"
	return rep, nil
}
