package ffrecord

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeDataset packs n samples of tag into dir in shards of about 300
// bytes and returns the samples.
func writeDataset(t *testing.T, dir string, n int, tag byte, overwrite bool) ([][]byte, error) {
	t.Helper()
	ctx := context.Background()
	w, err := NewShardedWriter(ctx, dir, ShardOptions{TargetSize: 300, Overwrite: overwrite})
	if err != nil {
		return nil, err
	}
	var want [][]byte
	for i := range n {
		b := bytes.Repeat([]byte{tag, byte(i)}, 20+i%7)
		want = append(want, b)
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	iw, err := w.CreateFile("index.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	iw.Write([]byte("{}\n"))
	if err := iw.Commit(); err != nil {
		t.Fatal(err)
	}
	_, err = w.Close()
	return want, err
}

// readAll reads every sample of the dataset at dir.
func readAll(t *testing.T, dir string) ([][]byte, error) {
	t.Helper()
	r, err := Open(context.Background(), []string{dir}, ReadOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	idx := make([]int64, r.N())
	for i := range idx {
		idx[i] = int64(i)
	}
	return r.ReadBatch(context.Background(), idx)
}

func sameSamples(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// A writer stopped after each step of publishing (as a crash there would
// leave it) leaves at the output exactly the old dataset, the new one, or
// nothing; never a prefix or a mix. Clean then restores the old dataset or
// removes the leftovers, and a rerun publishes the new one with nothing
// left beside it. Checked for a fresh output and for an overwrite.
func TestPublishCrashAtEveryStep(t *testing.T) {
	defer func() { PublishHookForTesting = nil }()
	ctx := context.Background()
	for _, overwrite := range []bool{false, true} {
		for _, step := range []string{StepStaged, StepAside, StepPublished, StepDone} {
			if step == StepAside && !overwrite {
				continue // nothing is set aside without an old dataset
			}
			name := step
			if overwrite {
				name += "-overwrite"
			}
			t.Run(name, func(t *testing.T) {
				parent := t.TempDir()
				dir := filepath.Join(parent, "ds")
				var old [][]byte
				if overwrite {
					var err error
					if old, err = writeDataset(t, dir, 40, 'o', false); err != nil {
						t.Fatal(err)
					}
				}
				crash := errors.New("crash")
				PublishHookForTesting = func(s string) error {
					if s == step {
						return crash
					}
					return nil
				}
				want, err := writeDataset(t, dir, 57, 'n', overwrite)
				PublishHookForTesting = nil
				if !errors.Is(err, crash) {
					t.Fatalf("Close: %v, want the hook's crash", err)
				}
				got, rerr := readAll(t, dir)
				switch {
				case rerr != nil:
					if step != StepAside && !(step == StepStaged && old == nil) {
						t.Fatalf("nothing readable after a crash at %s: %v", step, rerr)
					}
				case sameSamples(got, want):
					if step == StepStaged || step == StepAside {
						t.Fatalf("new dataset visible before it was published (crash at %s)", step)
					}
				case sameSamples(got, old):
					if step == StepPublished || step == StepDone {
						t.Fatalf("old dataset still at the output after publishing (crash at %s)", step)
					}
				default:
					t.Fatalf("crash at %s: the output holds %d samples, neither the old (%d) nor the new (%d) dataset", step, len(got), len(old), len(want))
				}
				ents, _ := os.ReadDir(parent)
				side := 0
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), ".ds.ffkit-") {
						side++
					}
				}
				if (step == StepStaged || (overwrite && step != StepDone)) != (side > 0) {
					t.Fatalf("crash at %s left %v beside the output", step, ents)
				}
				rep, err := Clean(ctx, dir)
				if err != nil {
					t.Fatal(err)
				}
				// A crash before publishing with an old dataset: Clean puts it back.
				if step == StepAside {
					if len(rep.Restored) != 1 {
						t.Fatalf("clean after a crash at %s restored %v", step, rep.Restored)
					}
					if got, err := readAll(t, dir); err != nil || !sameSamples(got, old) {
						t.Fatalf("restored dataset: %d samples, %v", len(got), err)
					}
				}
				ents, _ = os.ReadDir(parent)
				if len(ents) > 1 || (len(ents) == 1 && ents[0].Name() != "ds") {
					t.Fatalf("after Clean: %v", ents)
				}
				// The rerun publishes the new dataset and leaves nothing beside it.
				if _, err := writeDataset(t, dir, 57, 'n', true); err != nil {
					t.Fatal(err)
				}
				if got, err := readAll(t, dir); err != nil || !sameSamples(got, want) {
					t.Fatalf("rerun: %d samples, %v", len(got), err)
				}
				ents, _ = os.ReadDir(parent)
				if len(ents) != 1 {
					t.Fatalf("after the rerun: %v", ents)
				}
				if _, err := os.Stat(filepath.Join(dir, "index.jsonl")); err != nil {
					t.Fatalf("index not published with the shards: %v", err)
				}
			})
		}
	}
}

// Overwrite never throws away a directory that is not a dataset, and a
// writer without Overwrite refuses an existing dataset before writing.
func TestPublishRefusesForeignDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "home")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644)
	_, err := writeDataset(t, dir, 3, 'x', true)
	if !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("overwrite of a foreign directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "notes.txt")); string(b) != "mine" {
		t.Fatal("foreign file lost")
	}
	ents, _ := os.ReadDir(filepath.Dir(dir))
	if len(ents) != 1 {
		t.Fatalf("staging left behind: %v", ents)
	}
}

// A staging directory of a live writer is never cleaned, one of a dead
// writer is.
func TestCleanSparesLiveWriters(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "ds")
	live := filepath.Join(parent, ".ds"+stagingTag+"1-aa") // pid 1 is always alive
	dead := filepath.Join(parent, ".ds"+stagingTag+"999999999-bb")
	other := filepath.Join(parent, ".other"+stagingTag+"999999999-cc")
	for _, d := range []string{live, dead, other} {
		os.MkdirAll(filepath.Join(d, "sub"), 0o755)
		os.WriteFile(filepath.Join(d, "sub", "PART_00000.ffr"), []byte("x"), 0o644)
	}
	rep, err := Clean(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || !strings.HasSuffix(rep.Removed[0], filepath.Base(dead)) {
		t.Fatalf("removed %v", rep.Removed)
	}
	for _, d := range []string{live, other} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s removed: %v", d, err)
		}
	}
}
