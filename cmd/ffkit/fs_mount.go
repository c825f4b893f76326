package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
	_ "github.com/ffkit/ffkit/fs/clusterfs" // ffkit:// sources
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/localfs"
)

func init() {
	registerFS(newFSMountCmd)
	registerFS(newFSUmountCmd)
}

func newFSMountCmd() *cobra.Command {
	var (
		o                             fuse.Options
		maxRequest, raWindow, raBlock string
		consistent                    bool
		readWhole, kernelRA           string
	)
	c := &cobra.Command{
		Use:   "mount SOURCE MOUNTPOINT",
		Short: "Mount an ffkit:// path (or a local directory) with FUSE, until unmounted",
		Long: `Mount SOURCE at MOUNTPOINT with FUSE so that any program can use it.
SOURCE is a cluster path, ffkit://HOST:PORT/[path], or a local directory.

The command serves the mount in the foreground: it prints "mounted SOURCE at
MOUNTPOINT" once the mount is ready and returns when the file system is
unmounted, by Ctrl-C / SIGTERM here or by 'ffkit fs umount MOUNTPOINT'
(fusermount3 -u) elsewhere. Run it with '&' to keep the shell.

Consistency is close-to-open: data written through the mount is visible to
every other client once the file is closed. Names, attributes and missing
names are cached (by the kernel and by the mount) for --attr-timeout, 1s by
default: a change made by another client (a new, removed or renamed file,
a new length) is seen here at most that long after it was made, while this
mount's own changes are seen at once. --consistent turns the caches off
(--attr-timeout 0): every lookup and open asks the metadata service, so an
open sees the latest closed state exactly.

Reads of 64 KiB or more from a storage service on this host are
short-circuit reads of its chunk files (checked against their block CRCs):
through the page cache, or with O_DIRECT for files opened with O_DIRECT
(or every file, with --direct) when the bytes are not cached.
FFKIT_LOCAL_READS=0 sends them over the connection instead.

Files up to --read-whole are fetched whole when opened for reading and
served from memory, in whatever order they are read (numpy, image decoders
and torch.load read the head, the tail, then the head again). Larger files
read sequentially get a --read-ahead window; a reader that jumps (to a
footer, say) and comes back finds its window still there.

A call into the storage that takes longer than --timeout fails with
ETIMEDOUT, so a mount whose cluster went away returns errors instead of
hanging its callers.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, mnt := args[0], args[1]
			ctx := cmd.Context()
			var err error
			if consistent {
				if cmd.Flags().Changed("attr-timeout") && o.AttrTimeout != 0 {
					return usagef("--consistent and --attr-timeout %v contradict each other", o.AttrTimeout)
				}
				o.AttrTimeout = 0
			}
			if o.AttrTimeout < 0 {
				return usagef("--attr-timeout must not be negative")
			}
			if o.MaxRequest, err = parseIntSize("--max-request", maxRequest); err != nil {
				return err
			}
			if o.ReadAhead, err = parseIntSize("--read-ahead", raWindow); err != nil {
				return err
			}
			if o.ReadAheadBlock, err = parseIntSize("--read-ahead-block", raBlock); err != nil {
				return err
			}
			if o.ReadAhead == 0 {
				o.ReadAhead = -1 // 0 on the command line means off
			}
			whole, err := parseIntSize("--read-whole", readWhole)
			if err != nil {
				return err
			}
			o.ReadWhole = int64(whole)
			if o.ReadWhole == 0 {
				o.ReadWhole = -1
			}
			if o.KernelReadAhead, err = parseIntSize("--kernel-read-ahead", kernelRA); err != nil {
				return err
			}
			if o.KernelReadAhead == 0 {
				o.KernelReadAhead = -1 // the kernel's default
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			if !fs.IsURL(src) {
				if src, err = filepath.Abs(src); err != nil {
					return usagef("source %s: %v", args[0], err)
				}
			}
			backend, root, err := fs.Resolve(ctx, src)
			if err != nil {
				return err
			}
			if _, ok := backend.(*localfs.FS); ok {
				// Symlinks, special files, links and xattrs pass through.
				backend = localfs.NewPOSIX()
			}
			if o.FsName == "" {
				o.FsName = args[0]
			}
			srv, err := fuse.Mount(backend, root, mnt, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(human(), "mounted %s at %s\n", args[0], mnt)
			done := make(chan struct{})
			go func() { srv.Wait(); close(done) }()
			select {
			case <-done: // unmounted from outside
			case <-ctx.Done():
				if err := srv.Unmount(); err != nil {
					return err
				}
				<-done
			}
			if jsonOut {
				return printJSON(map[string]any{"source": args[0], "mountpoint": mnt, "stats": srv.Stats()})
			}
			fmt.Fprintf(human(), "unmounted %s\n", mnt)
			return nil
		},
	}
	f := c.Flags()
	f.BoolVar(&o.ReadOnly, "read-only", false, "refuse every change (EROFS)")
	f.DurationVar(&o.Timeout, "timeout", 75*time.Second, "bound on every call into the storage; past it the caller gets ETIMEDOUT")
	f.DurationVar(&o.AttrTimeout, "attr-timeout", time.Second, "how long names, attributes and missing names are cached: another client's changes are seen within it (0: no caching)")
	f.BoolVar(&consistent, "consistent", false, "cache no names or attributes (--attr-timeout 0): every lookup and open asks the metadata service")
	f.StringVar(&maxRequest, "max-request", "1M", "largest FUSE read/write request (max_read, max_write)")
	f.StringVar(&raWindow, "read-ahead", "32M", "read-ahead window of a file read sequentially (0: off)")
	f.StringVar(&raBlock, "read-ahead-block", "4M", "size of each read-ahead read (several run in parallel)")
	f.StringVar(&readWhole, "read-whole", "16M", "fetch files up to this size whole when they are opened for reading, and serve their reads from memory (0: off)")
	f.StringVar(&kernelRA, "kernel-read-ahead", "4M", "the kernel's read-ahead for the mount (its read_ahead_kb; needs root; 0: the kernel's default)")
	f.IntVar(&o.MaxBackground, "max-background", 256, "asynchronous requests the kernel keeps in flight")
	f.IntVar(&o.MaxBatch, "max-batch", 128, "most concurrent reads gathered into one batched storage read")
	f.BoolVar(&o.Direct, "direct", false, "read every file with O_DIRECT where supported (cold reads; files opened with O_DIRECT are read so anyway)")
	f.BoolVar(&o.AllowOther, "allow-other", false, "let other users use the mount")
	f.BoolVar(&o.Debug, "debug", false, "log every FUSE request on stderr")
	return c
}

func parseIntSize(flag, s string) (int, error) {
	v, err := bench.ParseSize(s)
	if err != nil {
		return 0, usagef("%s: %v", flag, err)
	}
	return int(v), nil
}

func newFSUmountCmd() *cobra.Command {
	var lazy bool
	c := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a file system mounted by 'ffkit fs mount'",
		Long: `Unmount MOUNTPOINT (fusermount3 -u); the 'ffkit fs mount' process serving it
then exits. A busy mount (a process has its working directory or a file open
in it) fails with "device or resource busy" unless --lazy detaches it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return usagef("mount point %s: %v", args[0], err)
			}
			if !fuse.IsMounted(mnt) {
				if _, err := os.Stat(mnt); err != nil {
					return usagef("%s: %v", args[0], err)
				}
				return usagef("%s is not a FUSE mount", args[0])
			}
			if err := fuse.Unmount(mnt, lazy); err != nil {
				if !lazy && errors.Is(err, syscall.EBUSY) {
					return fmt.Errorf("%w\n%s is busy: a process has its working directory or a file open in it; stop it (see 'fuser -vm %s'), or detach the mount now with 'ffkit fs umount --lazy %s' (released when its last user leaves)",
						err, args[0], args[0], args[0])
				}
				return err
			}
			fmt.Fprintf(human(), "unmounted %s\n", args[0])
			return nil
		},
	}
	c.Flags().BoolVar(&lazy, "lazy", false, "detach a busy mount now; it is released when its last user leaves")
	return c
}
