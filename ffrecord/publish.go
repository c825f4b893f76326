package ffrecord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/ffkit/ffkit/fs"
)

// Publishing a directory dataset. A ShardedWriter writes every shard (and
// any file added with CreateFile, such as pack's index) into a staging
// directory beside the output,
//
//	PARENT/.NAME.ffkit-staging-PID-RANDOM
//
// and Close publishes it with one directory rename onto PARENT/NAME. When
// NAME already holds a dataset (ShardOptions.Overwrite), it is first renamed
// aside to PARENT/.NAME.ffkit-old-PID-RANDOM, then the staging directory is
// renamed into place, then the old one is removed. A reader of NAME so sees
// the complete old dataset, the complete new one, or nothing; never a mix
// or a prefix. A crash between the two renames leaves nothing at NAME and
// both complete datasets beside it; Clean restores the old one.
//
// Clean (run by every new ShardedWriter on its output, and by
// `ffkit pack --clean`) removes the staging directories of writers that
// are gone, restores an old dataset that was set aside when nothing was
// published in its place, and removes one that was replaced. Names begin
// with a dot, so no reader lists them as data.
const (
	stagingTag = ".ffkit-staging-"
	oldTag     = ".ffkit-old-"
)

// Publish steps, in order, for PublishHookForTesting.
const (
	StepStaged    = "staged"    // every file is in the staging directory
	StepAside     = "aside"     // an old dataset was renamed aside
	StepPublished = "published" // the staging directory is the dataset
	StepDone      = "done"      // the old dataset is removed
)

// PublishHookForTesting, if set, is called after each publish step; a
// non-nil error stops Close right there, leaving the directories as a crash
// at that point would (nothing is cleaned up).
var PublishHookForTesting func(step string) error

// hookStop is an error of PublishHookForTesting.
type hookStop struct{ err error }

func (h hookStop) Error() string { return "ffrecord: publish stopped at a test hook: " + h.err.Error() }
func (h hookStop) Unwrap() error { return h.err }

// datasetFile reports whether a directory entry is part of a dataset that
// a ShardedWriter may replace: shards, pack's sidecar index, and the
// pending shards of older ffkit versions.
func datasetFile(e fs.FileInfo) bool {
	if e.IsDir {
		return false
	}
	n := e.Name
	return strings.HasSuffix(n, ".ffr") || n == "index.jsonl" || n == "index.csv" ||
		(strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".ffr.pending"))
}

// sideName is a fresh hidden name beside dir for a staging or old copy.
func sideName(dir, tag string) string {
	var b [6]byte
	rand.Read(b[:])
	return path.Join(path.Dir(dir), "."+path.Base(dir)+tag+strconv.Itoa(os.Getpid())+"-"+hex.EncodeToString(b[:]))
}

// sideOwner parses the writer pid from a side name of base, or returns ok false.
func sideOwner(name, base, tag string) (pid int, ok bool) {
	rest, found := strings.CutPrefix(name, "."+base+tag)
	if !found {
		return 0, false
	}
	p, _, found := strings.Cut(rest, "-")
	if !found {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// active holds the side directories (paths inside their FS) that writers
// of this process are using, so that Clean in a long-lived process (the
// Python engine, a scan job) spares its own writers but not what an
// abandoned writer of the same process left.
var (
	activeMu sync.Mutex
	active   = map[string]bool{} // guarded by activeMu
)

func setActive(p string, on bool) {
	activeMu.Lock()
	defer activeMu.Unlock()
	if on {
		active[p] = true
	} else {
		delete(active, p)
	}
}

// inUse reports whether the side directory p, made by process pid of this
// host, may still be written to.
func inUse(p string, pid int) bool {
	if pid == os.Getpid() {
		activeMu.Lock()
		defer activeMu.Unlock()
		return active[p]
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// CleanReport says what Clean did.
type CleanReport struct {
	Removed  []string `json:"removed"`  // staging or replaced directories removed
	Restored []string `json:"restored"` // old datasets renamed back into place
}

// Clean tidies what killed writers left beside the dataset directory dir
// (a local path or a URL): staging directories of writers that are no
// longer running are removed; an old dataset set aside is renamed back if
// nothing was published at dir, and removed otherwise. Writers are
// recognised by process id, so a writer running on another host that
// shares the file system must be finished first.
func Clean(ctx context.Context, dir string) (CleanReport, error) {
	fsys, name, err := fs.Resolve(ctx, dir)
	if err != nil {
		return CleanReport{}, fmt.Errorf("ffrecord: %w", err)
	}
	return clean(ctx, fsys, name, dir)
}

func clean(ctx context.Context, fsys fs.FS, name, display string) (CleanReport, error) {
	rep := CleanReport{Removed: []string{}, Restored: []string{}}
	name = path.Clean(name)
	parent, base := path.Dir(name), path.Base(name)
	ents, err := fsys.List(ctx, parent)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("ffrecord: clean %s: %w", display, err)
	}
	_, err = fsys.Stat(ctx, name)
	present := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("ffrecord: clean %s: %w", display, err)
	}
	shown := func(n string) string { return fs.Join(path.Dir(display), n) }
	for _, e := range ents {
		if !e.IsDir {
			continue
		}
		full := path.Join(parent, e.Name)
		if pid, ok := sideOwner(e.Name, base, stagingTag); ok && !inUse(full, pid) {
			if err := removeAll(ctx, fsys, full); err != nil {
				return rep, fmt.Errorf("ffrecord: clean %s: %w", display, err)
			}
			rep.Removed = append(rep.Removed, shown(e.Name))
			continue
		}
		if pid, ok := sideOwner(e.Name, base, oldTag); ok && !inUse(full, pid) {
			if !present {
				if err := fsys.Rename(ctx, full, name); err != nil {
					return rep, fmt.Errorf("ffrecord: clean %s: restore %s: %w", display, e.Name, err)
				}
				present = true
				rep.Restored = append(rep.Restored, shown(e.Name))
				continue
			}
			if err := removeAll(ctx, fsys, full); err != nil {
				return rep, fmt.Errorf("ffrecord: clean %s: %w", display, err)
			}
			rep.Removed = append(rep.Removed, shown(e.Name))
		}
	}
	return rep, nil
}

// removeAll removes a directory tree through fsys.
func removeAll(ctx context.Context, fsys fs.FS, dir string) error {
	ents, err := fsys.List(ctx, dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name)
		if e.IsDir {
			err = removeAll(ctx, fsys, p)
		} else {
			err = fsys.Remove(ctx, p)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := fsys.Remove(ctx, dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// checkReplaceable fails unless dir is missing, empty, or (with overwrite)
// holds only dataset files, so that publishing never throws away anything
// but a dataset.
func checkReplaceable(ctx context.Context, fsys fs.FS, dir, display string, overwrite bool) (exists bool, err error) {
	st, err := fsys.Stat(ctx, dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ffrecord: %s: %w", display, err)
	}
	if !st.IsDir {
		return false, fmt.Errorf("%w: %s is a file, not a dataset directory", fs.ErrExist, display)
	}
	ents, err := fsys.List(ctx, dir)
	if err != nil {
		return false, fmt.Errorf("ffrecord: list %s: %w", display, err)
	}
	for _, e := range ents {
		if !datasetFile(e) {
			return false, fmt.Errorf("%w: %s holds %s, which is not part of an FFRecord dataset; not replacing it", fs.ErrExist, display, e.Name)
		}
		if !overwrite {
			return false, fmt.Errorf("%w: %s already holds %s; remove it or overwrite", fs.ErrExist, display, e.Name)
		}
	}
	return true, nil
}

// PublishStep reports that a publish step is done to PublishHookForTesting
// (if set). Writers that publish in steps of their own (pack's single-file
// output and its index) call it too, so one test hook reaches every step.
func PublishStep(step string) error {
	if PublishHookForTesting != nil {
		if err := PublishHookForTesting(step); err != nil {
			return hookStop{err}
		}
	}
	return nil
}

// publish renames the staging directory onto w.dir, setting an existing
// dataset aside first.
func (w *ShardedWriter) publish() error {
	hook := PublishStep
	if err := hook(StepStaged); err != nil {
		return err
	}
	exists, err := checkReplaceable(w.ctx, w.fsys, w.dir, w.display, w.opts.Overwrite)
	if err != nil {
		return err
	}
	var old string
	if exists {
		old = sideName(w.dir, oldTag)
		setActive(old, true)
		defer setActive(old, false)
		if err := w.fsys.Rename(w.ctx, w.dir, old); err != nil {
			return fmt.Errorf("ffrecord: set %s aside: %w", w.display, err)
		}
		if err := hook(StepAside); err != nil {
			return err
		}
	}
	if err := w.fsys.Rename(w.ctx, w.staging, w.dir); err != nil {
		if old != "" {
			w.fsys.Rename(w.ctx, old, w.dir) // put the old dataset back
		}
		return fmt.Errorf("ffrecord: publish %s: %w", w.display, err)
	}
	w.staging = ""
	if err := hook(StepPublished); err != nil {
		return err
	}
	if old != "" {
		if err := removeAll(w.ctx, w.fsys, old); err != nil {
			return fmt.Errorf("ffrecord: %s is published; removing the replaced dataset %s failed: %w", w.display, old, err)
		}
	}
	return hook(StepDone)
}
