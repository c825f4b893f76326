package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/pack"
)

// CLI tests of pack: the atomic publish under SIGKILL, gzip tar sources,
// refused flag values, and cluster (ffkit://) sources.

// packSource writes n files of about size bytes, each filled with tag.
func packSource(t *testing.T, dir string, n, size int, tag byte) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	for i := range n {
		b := bytes.Repeat([]byte{tag, byte(i), byte(i >> 8)}, size/3+i%5)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%05d", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// datasetSamples reads every sample of a dataset; nil and the error when
// it does not open.
func datasetSamples(p string) ([][]byte, error) {
	ctx := context.Background()
	r, err := ffrecord.Open(ctx, []string{p}, ffrecord.ReadOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	idx := make([]int64, r.N())
	for i := range idx {
		idx[i] = int64(i)
	}
	return r.ReadBatch(ctx, idx)
}

// sourceSamples reads a packSource directory's files in packing order.
func sourceSamples(t *testing.T, dir string) [][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out = append(out, b)
	}
	return out
}

func equalSamples(a, b [][]byte) bool {
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

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stopped reports whether process pid is stopped (SIGSTOP).
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'T'
}

// checkOldOrNew fails unless the dataset at out is exactly old or exactly
// new (or, when allowNothing, absent), and verify agrees.
func checkOldOrNew(t *testing.T, out string, old, new [][]byte, allowNothing bool) string {
	t.Helper()
	got, err := datasetSamples(out)
	v := ffr(t, "verify", out)
	switch {
	case err != nil:
		if !allowNothing {
			t.Fatalf("nothing readable at %s: %v", out, err)
		}
		if v.code == 0 {
			t.Fatalf("verify passed a dataset that does not open: %s", v.stdout)
		}
		return "nothing"
	case equalSamples(got, new):
		if v.code != 0 {
			t.Fatalf("verify of the complete new dataset: exit %d: %s", v.code, v.stderr)
		}
		return "new"
	case old != nil && equalSamples(got, old):
		if v.code != 0 {
			t.Fatalf("verify of the complete old dataset: exit %d: %s", v.code, v.stderr)
		}
		return "old"
	}
	t.Fatalf("%s holds %d samples, neither the old (%d) nor the new (%d) dataset; verify exit %d: %s",
		out, len(got), len(old), len(new), v.code, v.stdout)
	return ""
}

// A pack killed with SIGKILL as soon as its first shard is written leaves
// nothing at OUT (the old code left a prefix that verify passed); the same
// over an existing dataset with --force leaves the old dataset, never a
// mix. pack --clean then removes the leftovers and a rerun succeeds.
func TestCLIPackSIGKILLLeavesOldOrNothing(t *testing.T) {
	dir := t.TempDir()
	src, src2 := filepath.Join(dir, "src"), filepath.Join(dir, "src2")
	packSource(t, src, 2000, 1000, 'a')
	packSource(t, src2, 1500, 1500, 'b')
	first, second := sourceSamples(t, src), sourceSamples(t, src2)
	out := filepath.Join(dir, "out")
	shardOnDisk := func() bool {
		ms, _ := filepath.Glob(filepath.Join(out, "PART_*.ffr"))
		ms2, _ := filepath.Glob(filepath.Join(dir, ".out.ffkit-staging-*", "PART_*.ffr"))
		return len(ms)+len(ms2) > 0
	}
	kill := func(args ...string) {
		cmd := exec.Command(ffrBinary(t), args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the first shard", func() bool { return shardOnDisk() || cmd.ProcessState != nil })
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	kill("pack", src, "-o", out, "--shard-size", "16K")
	if got := checkOldOrNew(t, out, nil, first, true); got != "nothing" {
		t.Logf("the pack finished before the kill (%s)", got)
	}
	ffrMust(t, 0, "pack", "--clean", "-o", out)
	ffrMust(t, 0, "pack", src, "-o", out, "--shard-size", "16K", "--force")
	checkOldOrNew(t, out, nil, first, false)
	kill("pack", src2, "-o", out, "--shard-size", "16K", "--force")
	checkOldOrNew(t, out, first, second, false)
	ffrMust(t, 0, "pack", "--clean", "-o", out)
	ffrMust(t, 0, "pack", src2, "-o", out, "--shard-size", "16K", "--force")
	checkOldOrNew(t, out, first, second, false)
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Fatalf("left beside the output: %v", ents)
	}
}

// A pack stopped (SIGSTOP) after each publish step and then SIGKILLed:
// OUT is the old dataset, the new one, or (between the two renames)
// nothing, with both complete beside it; pack --clean restores the old
// one there, and a rerun publishes with nothing left behind.
func TestCLIPackKilledAtEachPublishStep(t *testing.T) {
	dir := t.TempDir()
	src, src2 := filepath.Join(dir, "src"), filepath.Join(dir, "src2")
	packSource(t, src, 300, 1000, 'a')
	packSource(t, src2, 200, 1500, 'b')
	old, new := sourceSamples(t, src), sourceSamples(t, src2)
	for _, step := range []string{ffrecord.StepStaged, ffrecord.StepAside, ffrecord.StepPublished, ffrecord.StepDone} {
		t.Run(step, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			ffrMust(t, 0, "pack", src, "-o", out, "--shard-size", "64K")
			cmd := exec.Command(ffrBinary(t), "pack", src2, "-o", out, "--shard-size", "64K", "--force")
			cmd.Env = append(os.Environ(), "FFKIT_PACK_STOP_AT="+step)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "pack to stop at "+step, func() bool { return stopped(cmd.Process.Pid) })
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			want := map[string]string{ffrecord.StepStaged: "old", ffrecord.StepAside: "nothing", ffrecord.StepPublished: "new", ffrecord.StepDone: "new"}[step]
			if got := checkOldOrNew(t, out, old, new, true); got != want {
				t.Fatalf("killed at %s: %s at the output, want %s", step, got, want)
			}
			ffrMust(t, 0, "pack", "--clean", "-o", out)
			want = map[string]string{ffrecord.StepStaged: "old", ffrecord.StepAside: "old", ffrecord.StepPublished: "new", ffrecord.StepDone: "new"}[step]
			if got := checkOldOrNew(t, out, old, new, false); got != want {
				t.Fatalf("after --clean: %s, want %s", got, want)
			}
			if ents, _ := os.ReadDir(filepath.Dir(out)); len(ents) != 1 {
				t.Fatalf("left beside the output after --clean: %v", ents)
			}
			ffrMust(t, 0, "pack", src2, "-o", out, "--shard-size", "64K", "--force")
			checkOldOrNew(t, out, old, new, false)
		})
	}
}

// A single-file pack with --force stopped (SIGSTOP) after each of its
// publish steps and then SIGKILLed: OUT is the old file or the new one,
// and the sidecar index beside it is absent or describes exactly that
// file, sample for sample (the old code published the file before
// replacing the index, so a kill there paired the new file with the old
// index). A rerun publishes both.
func TestCLIPackFileKilledAtEachPublishStep(t *testing.T) {
	dir := t.TempDir()
	src, src2 := filepath.Join(dir, "src"), filepath.Join(dir, "src2")
	packSource(t, src, 300, 1000, 'a')
	packSource(t, src2, 200, 1500, 'b')
	old, new := sourceSamples(t, src), sourceSamples(t, src2)
	// indexMatches: the index is absent, or lists exactly the samples of got.
	indexMatches := func(out string, got [][]byte) bool {
		f, err := os.Open(out + ".index.jsonl")
		if os.IsNotExist(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ents, err := pack.ReadIndex(f)
		if err != nil || len(ents) != len(got) {
			t.Logf("index: %d entries for %d samples (%v)", len(ents), len(got), err)
			return false
		}
		for i, e := range ents {
			if e.Size != int64(len(got[i])) {
				t.Logf("index entry %d: size %d, the sample is %d bytes", i, e.Size, len(got[i]))
				return false
			}
		}
		return true
	}
	for _, c := range []struct{ step, want string }{{pack.StepIndexRemoved, "old"}, {pack.StepFilePublished, "new"}} {
		t.Run(c.step, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.ffr")
			ffrMust(t, 0, "pack", src, "-o", out)
			cmd := exec.Command(ffrBinary(t), "pack", src2, "-o", out, "--force")
			cmd.Env = append(os.Environ(), "FFKIT_PACK_STOP_AT="+c.step)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "pack to stop at "+c.step, func() bool { return stopped(cmd.Process.Pid) })
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			got := checkOldOrNew(t, out, old, new, false)
			if got != c.want {
				t.Fatalf("killed at %s: %s at the output, want %s", c.step, got, c.want)
			}
			samples, _ := datasetSamples(out)
			if !indexMatches(out, samples) {
				t.Fatalf("killed at %s: the index beside %s describes another file", c.step, out)
			}
			ffrMust(t, 0, "pack", src2, "-o", out, "--force")
			checkOldOrNew(t, out, old, new, false)
			samples, _ = datasetSamples(out)
			if _, err := os.Stat(out + ".index.jsonl"); err != nil || !indexMatches(out, samples) {
				t.Fatalf("the rerun's index: %v", err)
			}
		})
	}
}

// pack reads gzip tar directly and names the format it detected; values
// that make no sense are refused with exit 2 naming the flag.
func TestCLIPackGzipTarAndBadFlags(t *testing.T) {
	dir := t.TempDir()
	tgz := filepath.Join(dir, "a.tgz")
	f, _ := os.Create(tgz)
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	var want [][]byte
	for i := range 20 {
		b := bytes.Repeat([]byte{byte(i)}, 100+i)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("m%02d", i), Size: int64(len(b)), Mode: 0o644})
		tw.Write(b)
		want = append(want, b)
	}
	tw.Close()
	zw.Close()
	f.Close()
	out := filepath.Join(dir, "ds")
	r := ffrMust(t, 0, "pack", tgz, "-o", out)
	if !strings.Contains(string(r.stderr)+string(r.stdout), "(tar.gz)") {
		t.Fatalf("pack does not name the format it read: %s%s", r.stdout, r.stderr)
	}
	if got, err := datasetSamples(out); err != nil || !equalSamples(got, want) {
		t.Fatalf("gzip tar: %d samples, %v", len(got), err)
	}
	odd := filepath.Join(dir, "odd")
	os.WriteFile(odd, []byte("\x89PNG\r\n\x1a\nxxxx"), 0o644)
	r = ffrMust(t, 2, "pack", odd, "-o", filepath.Join(dir, "x"))
	if !strings.Contains(string(r.stderr), "89 50 4e 47") {
		t.Fatalf("detection does not say what it saw: %s", r.stderr)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--shard-size", "0"}, "--shard-size"},
		{[]string{"--shard-size", "-5"}, "--shard-size"},
		{[]string{"--align", "-1"}, "--align"},
		{[]string{"--align", "3"}, "--align"},
		{[]string{"--workers", "0"}, "--workers"},
	} {
		args := append([]string{"pack", tgz, "-o", filepath.Join(dir, "y")}, c.args...)
		r := ffrMust(t, 2, args...)
		if !strings.Contains(string(r.stderr), c.flag) {
			t.Fatalf("%v: the message does not name %s: %s", c.args, c.flag, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "y")); !os.IsNotExist(err) {
		t.Fatal("a refused pack wrote its output")
	}
}

// Samples of 0 B, 31 MiB and 33 MiB pack locally and onto the cluster and
// read back as they are; every source (Arrow included) packs the same from
// an ffkit:// path as from the local copy, byte for byte (shards and
// index), and onto the cluster; a pack onto the cluster killed at publish
// steps of --force leaves the old dataset, the new one or (between the
// renames) nothing, pack --clean restores, a rerun leaves no staging.
func TestCLIPackClusterSources(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	local := t.TempDir()
	srcs := filepath.Join(local, "srcs")
	packSource(t, filepath.Join(srcs, "tree", "sub"), 30, 3000, 't')
	os.WriteFile(filepath.Join(srcs, "tree", "top.bin"), bytes.Repeat([]byte("xyz"), 11<<20+1), 0o644) // 33 MiB + 3: over the old hang
	var lines []string
	for i := range 40 {
		lines = append(lines, fmt.Sprintf(`{"n":%d,"s":"%s"}`, i, strings.Repeat("y", i*50)))
	}
	os.WriteFile(filepath.Join(srcs, "c.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	writeTarFile := func(p string, gz bool, names []string) {
		f, _ := os.Create(p)
		defer f.Close()
		var tw *tar.Writer
		var zw *gzip.Writer
		if gz {
			zw = gzip.NewWriter(f)
			tw = tar.NewWriter(zw)
		} else {
			tw = tar.NewWriter(f)
		}
		for i, n := range names {
			b := bytes.Repeat([]byte{byte(i)}, 100+i*37)
			tw.WriteHeader(&tar.Header{Name: n, Size: int64(len(b)), Mode: 0o644})
			tw.Write(b)
		}
		tw.Close()
		if zw != nil {
			zw.Close()
		}
	}
	var members, wds []string
	for i := range 25 {
		members = append(members, fmt.Sprintf("m/%03d.bin", i))
	}
	for k := range 12 { // WebDataset: every pair of members shares a key
		wds = append(wds, fmt.Sprintf("%06d.jpg", k), fmt.Sprintf("%06d.json", k))
	}
	writeTarFile(filepath.Join(srcs, "a.tar"), false, members)
	writeTarFile(filepath.Join(srcs, "a.tgz"), true, members)
	os.MkdirAll(filepath.Join(srcs, "wds"), 0o755)
	writeTarFile(filepath.Join(srcs, "wds", "s-0.tar"), false, wds[:10])
	writeTarFile(filepath.Join(srcs, "wds", "s-1.tar.gz"), true, wds[10:])

	writeParquet(t, filepath.Join(srcs, "t.parquet"))
	writeArrow(t, filepath.Join(srcs, "t.arrow"))
	// samples of 0 B, 31 MiB and 33 MiB in one dataset (kept out of srcs:
	// they are packed from the local copy only)
	sizes := filepath.Join(local, "sizes")
	os.MkdirAll(sizes, 0o755)
	for i, n := range []int{0, 31 << 20, 33 << 20} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(j*7 + i + j>>20)
		}
		os.WriteFile(filepath.Join(sizes, fmt.Sprintf("s%d", i)), b, 0o644)
	}

	u := startUp(t, t.TempDir())
	U := u.url
	// clusterSamples fetches a dataset from the cluster and reads it; an
	// error when there is nothing there that opens.
	gets := 0
	clusterSamples := func(url string) ([][]byte, error) {
		gets++
		p := filepath.Join(local, fmt.Sprintf("fetched-%d", gets))
		if _, code := u.run(t, "fs", "get", url, p); code != 0 {
			return nil, fmt.Errorf("fs get %s: exit %d", url, code)
		}
		defer os.RemoveAll(p)
		return datasetSamples(p)
	}

	// Samples of 0 B, 31 MiB and 33 MiB (the old writer hung at 32 MiB)
	// pack locally and onto the cluster, verify, and read back as they are.
	want := sourceSamples(t, sizes)
	u.must(t, "pack", sizes, "-o", filepath.Join(local, "sizes-out"))
	u.must(t, "pack", sizes, "-o", U+"/sizes")
	u.must(t, "verify", filepath.Join(local, "sizes-out"))
	u.must(t, "verify", U+"/sizes")
	if got, err := datasetSamples(filepath.Join(local, "sizes-out")); err != nil || !equalSamples(got, want) {
		t.Fatalf("0 B, 31 MiB, 33 MiB packed locally: %d samples back, %v", len(got), err)
	}
	if got, err := clusterSamples(U + "/sizes"); err != nil || !equalSamples(got, want) {
		t.Fatalf("0 B, 31 MiB, 33 MiB packed onto the cluster: %d samples back, %v", len(got), err)
	}
	os.RemoveAll(sizes)
	os.RemoveAll(filepath.Join(local, "sizes-out"))
	u.must(t, "fs", "rm", "-r", U+"/sizes")

	u.must(t, "fs", "mkdir", U+"/in")
	u.must(t, "fs", "put", srcs, U+"/in")
	for _, c := range []struct {
		src  string
		args []string
	}{
		{"tree", nil},
		{"c.jsonl", nil},
		{"a.tar", nil},
		{"a.tgz", nil},
		{"wds", []string{"--format", "webdataset"}},
		{"t.parquet", []string{"--column", "img"}},
		{"t.parquet", nil},
		{"t.arrow", []string{"--column", "img"}},
	} {
		name := strings.ReplaceAll(c.src, ".", "_") + strings.Join(c.args, "")
		lo, cl := filepath.Join(local, "lo-"+name), filepath.Join(local, "cl-"+name)
		u.must(t, append([]string{"pack", filepath.Join(srcs, c.src), "-o", lo, "--shard-size", "1M"}, c.args...)...)
		u.must(t, append([]string{"pack", U + "/in/srcs/" + c.src, "-o", cl, "--shard-size", "1M"}, c.args...)...)
		u.must(t, append([]string{"pack", filepath.Join(srcs, c.src), "-o", U + "/out/" + name, "--shard-size", "1M"}, c.args...)...)
		ents, _ := os.ReadDir(lo)
		if len(ents) < 2 {
			t.Fatalf("%s: packed into %v", c.src, ents)
		}
		for _, e := range ents {
			a, _ := os.ReadFile(filepath.Join(lo, e.Name()))
			b, err := os.ReadFile(filepath.Join(cl, e.Name()))
			if err != nil || !bytes.Equal(a, b) {
				t.Fatalf("%s: %s packed from the cluster differs from the local pack (%v)", c.src, e.Name(), err)
			}
		}
		want, err := datasetSamples(lo)
		if err != nil || len(want) == 0 {
			t.Fatal(err)
		}
		got := filepath.Join(local, "get-"+name)
		u.must(t, "fs", "get", U+"/out/"+name, got)
		if s, err := datasetSamples(got); err != nil || !equalSamples(s, want) {
			t.Fatalf("%s: the dataset packed onto the cluster differs (%v)", c.src, err)
		}
	}
	// A kill at publish steps of --force on the cluster: OUT is the old
	// dataset, the new one, or (between the renames) nothing, sample for
	// sample; pack --clean restores the old one there, and a rerun
	// publishes with no staging left. FFKIT_TEST_PUBLISH_STEPS=all runs
	// every step; by default the two around the renames.
	old, _ := datasetSamples(filepath.Join(local, "lo-a_tar"))
	new, _ := datasetSamples(filepath.Join(local, "lo-c_jsonl"))
	steps := []string{ffrecord.StepAside, ffrecord.StepPublished}
	if os.Getenv("FFKIT_TEST_PUBLISH_STEPS") == "all" {
		steps = []string{ffrecord.StepStaged, ffrecord.StepAside, ffrecord.StepPublished, ffrecord.StepDone}
	}
	oldOrNew := func(ds string, allowNothing bool) string {
		t.Helper()
		got, err := clusterSamples(ds)
		_, v := u.run(t, "verify", ds)
		switch {
		case err != nil:
			if !allowNothing {
				t.Fatalf("nothing readable at %s: %v", ds, err)
			}
			if v == 0 {
				t.Fatalf("verify passed %s, which does not open", ds)
			}
			return "nothing"
		case equalSamples(got, new):
			if v != 0 {
				t.Fatalf("verify of the complete new dataset: exit %d", v)
			}
			return "new"
		case equalSamples(got, old):
			if v != 0 {
				t.Fatalf("verify of the complete old dataset: exit %d", v)
			}
			return "old"
		}
		t.Fatalf("%s holds %d samples, neither the old (%d) nor the new (%d) dataset; verify exit %d", ds, len(got), len(old), len(new), v)
		return ""
	}
	for _, step := range steps {
		ds := U + "/kill/" + step
		u.must(t, "pack", filepath.Join(srcs, "a.tar"), "-o", ds)
		cmd := exec.Command(ffrBinary(t), "pack", filepath.Join(srcs, "c.jsonl"), "-o", ds, "--force")
		cmd.Env = append(append([]string{}, u.env...), "FFKIT_PACK_STOP_AT="+step)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "pack to stop at "+step, func() bool { return stopped(cmd.Process.Pid) })
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		want := map[string]string{ffrecord.StepStaged: "old", ffrecord.StepAside: "nothing", ffrecord.StepPublished: "new", ffrecord.StepDone: "new"}[step]
		if got := oldOrNew(ds, true); got != want {
			t.Fatalf("killed at %s on the cluster: %s at the output, want %s", step, got, want)
		}
		u.must(t, "pack", "--clean", "-o", ds)
		want = map[string]string{ffrecord.StepStaged: "old", ffrecord.StepAside: "old", ffrecord.StepPublished: "new", ffrecord.StepDone: "new"}[step]
		if got := oldOrNew(ds, false); got != want {
			t.Fatalf("killed at %s on the cluster, after --clean: %s, want %s", step, got, want)
		}
		u.must(t, "pack", filepath.Join(srcs, "c.jsonl"), "-o", ds, "--force")
		if got := oldOrNew(ds, false); got != "new" {
			t.Fatalf("the rerun after a kill at %s: %s", step, got)
		}
		if ls := u.must(t, "fs", "ls", U+"/kill"); strings.Contains(ls, "ffkit-staging") || strings.Contains(ls, "ffkit-old") {
			t.Fatalf("left on the cluster after a kill at %s:\n%s", step, ls)
		}
	}
}

// writeArrow writes a small Arrow IPC file with a binary column "img".
func writeArrow(t *testing.T, p string) {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}, {Name: "img", Type: arrow.BinaryTypes.Binary}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fw, err := ipc.NewFileWriter(f, ipc.WithSchema(sc))
	if err != nil {
		t.Fatal(err)
	}
	for batch := range 3 {
		for i := range 70 {
			b.Field(0).(*array.Int64Builder).Append(int64(batch*70 + i))
			b.Field(1).(*array.BinaryBuilder).Append(bytes.Repeat([]byte{byte(i), byte(batch)}, 1+i*29))
		}
		rec := b.NewRecordBatch()
		err := fw.Write(rec)
		rec.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeParquet writes a small Parquet file with a binary column "img".
func writeParquet(t *testing.T, p string) {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}, {Name: "img", Type: arrow.BinaryTypes.Binary}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for i := range 300 {
		b.Field(0).(*array.Int64Builder).Append(int64(i))
		b.Field(1).(*array.BinaryBuilder).Append(bytes.Repeat([]byte{byte(i)}, 1+i*41))
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(100)), pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
}
