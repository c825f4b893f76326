package pack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/ffrecord"
)

// want is what a source should pack into: names and bytes, in order.
type want struct {
	names   []string
	samples [][]byte
}

func (w *want) add(name string, b []byte) {
	w.names = append(w.names, name)
	w.samples = append(w.samples, b)
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rng.Uint32())
	}
	rand.NewChaCha8(seed).Read(b)
	return b
}

// readDataset reads every sample of a dataset (file or directory).
func readDataset(t *testing.T, p string) [][]byte {
	t.Helper()
	ctx := context.Background()
	r, err := ffrecord.Open(ctx, []string{p}, ffrecord.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := make([][]byte, r.N())
	for i := range out {
		if out[i], err = r.ReadOne(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func readIndexFile(t *testing.T, p string) []IndexEntry {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es, err := ReadIndex(f)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// checkPack packs src into a directory and into a .ffr file, twice each,
// and checks samples, index and determinism.
func checkPack(t *testing.T, src, format string, o Options, w want) {
	t.Helper()
	checkPackRuns(t, src, format, o, w, 2)
}

// checkPackRuns is checkPack with runs packs per output (1: no
// determinism check, for large inputs).
func checkPackRuns(t *testing.T, src, format string, o Options, w want, runs int) {
	t.Helper()
	ctx := context.Background()
	out := t.TempDir()
	for _, target := range []string{"ds", "one.ffr"} {
		var hashes []string
		for run := range runs {
			s, err := Open(ctx, src, o)
			if err != nil {
				t.Fatal(err)
			}
			if s.Format() != format {
				t.Fatalf("%s opened as %s, want %s", src, s.Format(), format)
			}
			dst := filepath.Join(out, fmt.Sprint(run), target)
			res, err := Pack(ctx, s, dst, Config{ShardSize: 64 << 10, Align: AlignAuto, Workers: 3})
			s.Close()
			if err != nil {
				t.Fatalf("pack %s -> %s: %v", src, target, err)
			}
			if res.Samples != int64(len(w.samples)) {
				t.Fatalf("%s: %d samples, want %d", target, res.Samples, len(w.samples))
			}
			got := readDataset(t, dst)
			if len(got) != len(w.samples) {
				t.Fatalf("%s: read %d samples, want %d", target, len(got), len(w.samples))
			}
			for i := range got {
				if !bytes.Equal(got[i], w.samples[i]) {
					t.Fatalf("%s: sample %d (%s) differs: %d bytes, want %d", target, i, w.names[i], len(got[i]), len(w.samples[i]))
				}
			}
			idx := filepath.Join(dst, "index.jsonl")
			if target == "one.ffr" {
				idx = dst + ".index.jsonl"
			}
			es := readIndexFile(t, idx)
			if len(es) != len(w.names) {
				t.Fatalf("index has %d entries, want %d", len(es), len(w.names))
			}
			for i, e := range es {
				if e.Source != w.names[i] || e.Size != int64(len(w.samples[i])) || e.Index != int64(i) {
					t.Fatalf("index entry %d: %+v, want %s of %d bytes", i, e, w.names[i], len(w.samples[i]))
				}
			}
			h := sha256.New()
			for _, f := range res.Files {
				b, _ := os.ReadFile(f)
				h.Write(b)
			}
			hashes = append(hashes, fmt.Sprintf("%x", h.Sum(nil)))
		}
		if runs > 1 && hashes[0] != hashes[1] {
			t.Fatalf("%s: same inputs, different bytes", target)
		}
	}
}

func writeTar(t *testing.T, p string, gz bool, members []string, data [][]byte) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var zw *gzip.Writer
	var tw *tar.Writer
	if gz {
		zw, _ = gzip.NewWriterLevel(f, gzip.BestSpeed)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(f)
	}
	tw.WriteHeader(&tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i, m := range members {
		if err := tw.WriteHeader(&tar.Header{Name: m, Size: int64(len(data[i])), Mode: 0o644, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(data[i])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
}

func TestSourcesDirJSONLTar(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	// a directory: nested files, sorted by relative path bytewise
	src := filepath.Join(dir, "files")
	var wd want
	names := []string{"b/z", "a.txt", "a/x", "empty", "big"}
	sizes := []int{100, 3000, 70 << 10, 0, 200 << 10}
	type nf struct {
		n string
		b []byte
	}
	var files []nf
	for i, n := range names {
		b := randBytes(rng, sizes[i])
		os.MkdirAll(filepath.Dir(filepath.Join(src, n)), 0o755)
		os.WriteFile(filepath.Join(src, n), b, 0o644)
		files = append(files, nf{n, b})
	}
	sort.Slice(files, func(a, b int) bool { return files[a].n < files[b].n })
	for _, f := range files {
		wd.add(f.n, f.b)
	}
	checkPack(t, src, "files", Options{}, wd)

	// JSON Lines, with a blank line and a CRLF line
	var wj want
	jl := filepath.Join(dir, "c.jsonl")
	lines := []string{`{"a":1}`, "", `{"b":"` + strings.Repeat("x", 100<<10) + `"}`, `{"c":3}` + "\r"}
	os.WriteFile(jl, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	wj.add("c.jsonl:1", []byte(lines[0]))
	wj.add("c.jsonl:3", []byte(lines[2]))
	wj.add("c.jsonl:4", []byte(`{"c":3}`))
	checkPack(t, jl, "jsonl", Options{}, wj)

	// tar and gzip tar: one sample per regular member
	var wt want
	var members []string
	var data [][]byte
	for i := range 30 {
		m := fmt.Sprintf("sub/%03d.bin", i)
		b := randBytes(rng, rng.IntN(20<<10))
		members = append(members, m)
		data = append(data, b)
		wt.add(m, b)
	}
	tp := filepath.Join(dir, "a.tar")
	writeTar(t, tp, false, members, data)
	checkPack(t, tp, "tar", Options{}, wt)
	for _, name := range []string{"a.tar.gz", "a.tgz", "gz-named.tar", "noext"} {
		p := filepath.Join(dir, name)
		writeTar(t, p, true, members, data)
		checkPack(t, p, "tar.gz", Options{}, wt)
	}
}

// WebDataset: members grouped by key (the name up to the first dot of its
// last element), fields in member order, the sample a FFWD container that
// DecodeWebDataset splits back; from a tar, a gzip tar and a directory of
// shards.
func TestSourceWebDataset(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	shards := filepath.Join(dir, "shards")
	os.MkdirAll(shards, 0o755)
	var w want
	var fields []map[string][]byte
	for s := range 3 {
		var members []string
		var data [][]byte
		members = append(members, "__meta__")
		data = append(data, []byte("skipped"))
		for k := range 5 {
			key := fmt.Sprintf("d%d/%06d", s, s*10+k)
			f := map[string][]byte{}
			var parts [][]byte
			var exts []string
			for _, ext := range []string{"jpg", "json", "seg.png"} {
				if ext == "seg.png" && k%2 == 0 {
					continue
				}
				b := randBytes(rng, 1+rng.IntN(8<<10))
				members = append(members, key+"."+strings.ToUpper(ext[:1])+ext[1:])
				data = append(data, b)
				f[ext] = b
				parts = append(parts, b)
				exts = append(exts, ext)
			}
			fields = append(fields, f)
			var sizes []member
			for _, p := range parts {
				sizes = append(sizes, member{size: int64(len(p))})
			}
			w.add(key, append(containerHeader(exts, sizes), bytes.Join(parts, nil)...))
		}
		writeTar(t, filepath.Join(shards, fmt.Sprintf("shard-%d.tar", s)), s == 1, members, data)
	}
	checkPack(t, shards, "webdataset", Options{Format: "webdataset"}, w)
	// one shard, read in place (Listed) and the same from a gzip shard
	one := want{w.names[:5], w.samples[:5]}
	s, err := Open(context.Background(), filepath.Join(shards, "shard-0.tar"), Options{Format: "webdataset"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(Listed); !ok {
		t.Fatal("an uncompressed WebDataset shard is not read in place")
	}
	s.Close()
	checkPack(t, filepath.Join(shards, "shard-0.tar"), "webdataset", Options{Format: "webdataset"}, one)
	for i, b := range w.samples {
		m, err := DecodeWebDataset(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != len(fields[i]) {
			t.Fatalf("sample %d: %d fields, want %d", i, len(m), len(fields[i]))
		}
		for ext, v := range fields[i] {
			if !bytes.Equal(m[ext], v) {
				t.Fatalf("sample %d field %s differs", i, ext)
			}
		}
	}
	// a duplicate extension under one key is an error naming it
	dup := filepath.Join(dir, "dup.tar")
	writeTar(t, dup, false, []string{"k.jpg", "k.jpg"}, [][]byte{{1}, {2}})
	if _, err := Open(context.Background(), dup, Options{Format: "webdataset"}); !errors.Is(err, ErrData) || !strings.Contains(err.Error(), `"jpg"`) {
		t.Fatalf("duplicate member: %v", err)
	}
	// truncated containers are refused, not read past their end
	for i := range len(w.samples[0]) {
		if _, err := DecodeWebDataset(w.samples[0][:i]); err == nil {
			t.Fatalf("container cut at %d accepted", i)
		}
	}
}

// Parquet and Arrow: one sample per row from a binary or string column,
// or the row as JSON; a NULL sample and a missing column are errors.
func TestSourceTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	mem := memory.DefaultAllocator
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}, {Name: "img", Type: arrow.BinaryTypes.Binary}, {Name: "txt", Type: arrow.BinaryTypes.String}}, nil)
	var recs []arrow.RecordBatch
	var wb, ws, wj want
	row := 0
	for batch := range 3 {
		b := array.NewRecordBuilder(mem, sc)
		for range 50 + batch*7 {
			img := randBytes(rng, rng.IntN(30<<10))
			txt := fmt.Sprintf("row %d é", row)
			b.Field(0).(*array.Int64Builder).Append(int64(row))
			b.Field(1).(*array.BinaryBuilder).Append(img)
			b.Field(2).(*array.StringBuilder).Append(txt)
			wb.add(fmt.Sprint(row), img)
			ws.add(fmt.Sprint(row), []byte(txt))
			wj.add(fmt.Sprint(row), nil)
			row++
		}
		recs = append(recs, b.NewRecordBatch())
		b.Release()
	}
	pq := filepath.Join(dir, "t.parquet")
	f, _ := os.Create(pq)
	pw, err := pqarrow.NewFileWriter(sc, f, nil, pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := pw.WriteBuffered(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	af := filepath.Join(dir, "t.arrow")
	f, _ = os.Create(af)
	fw, err := ipc.NewFileWriter(f, ipc.WithSchema(sc))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		fw.Write(r)
	}
	fw.Close()
	f.Close()
	as := filepath.Join(dir, "stream.arrows")
	f, _ = os.Create(as)
	sw := ipc.NewWriter(f, ipc.WithSchema(sc))
	for _, r := range recs {
		sw.Write(r)
	}
	sw.Close()
	f.Close()
	named := func(w want, file string) want {
		var o want
		for i, n := range w.names {
			o.add(file+":"+n, w.samples[i])
		}
		return o
	}
	checkPack(t, pq, "parquet", Options{Column: "img"}, named(wb, "t.parquet"))
	checkPack(t, pq, "parquet", Options{Column: "txt"}, named(ws, "t.parquet"))
	checkPack(t, af, "arrow", Options{Column: "img"}, named(wb, "t.arrow"))
	checkPack(t, as, "arrow", Options{Column: "txt", Format: "arrow"}, named(ws, "stream.arrows"))
	// whole rows as JSON objects
	s, err := Open(context.Background(), pq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "rows")
	if _, err := Pack(context.Background(), s, out, Config{}); err != nil {
		t.Fatal(err)
	}
	got := readDataset(t, out)
	if len(got) != row || !strings.HasPrefix(string(got[3]), `{"id":3,"img":"`) || !strings.Contains(string(got[3]), `"txt":"row 3 é"`) {
		t.Fatalf("row as JSON: %d rows, row 3 = %.80s", len(got), got[3])
	}
	if _, err := Open(context.Background(), pq, Options{Column: "nope"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "img") {
		t.Fatalf("missing column: %v", err)
	}
	if _, err := Open(context.Background(), pq, Options{Column: "id"}); !errors.Is(err, ErrUsage) {
		t.Fatalf("int column: %v", err)
	}
}

// Format detection names what it saw.
func TestDetectNamesWhatItSaw(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mystery")
	os.WriteFile(p, []byte("\x89PNG\r\n\x1a\n...."), 0o644)
	_, err := Open(context.Background(), p, Options{})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "89 50 4e 47") || !strings.Contains(err.Error(), "--format") {
		t.Fatalf("unknown format: %v", err)
	}
	os.WriteFile(p, nil, 0o644)
	if _, err := Open(context.Background(), p, Options{}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty file: %v", err)
	}
	// a gzip file that holds no tar says so
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte("not a tar archive at all, just text that is long enough to matter............"))
	zw.Close()
	os.WriteFile(p, b.Bytes(), 0o644)
	s, err := Open(context.Background(), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pack(context.Background(), s, filepath.Join(dir, "o"), Config{}); !errors.Is(err, ErrData) || !strings.Contains(err.Error(), "gzip tar") {
		t.Fatalf("gzip of text: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "o")); !os.IsNotExist(err) {
		t.Fatal("a failed pack published something")
	}
}

// A sample larger than everything the writer stages (the old limit: 32 MiB
// hung forever) packs from a directory (read in place, in parallel with
// the small ones) and from a gzip tar (streamed), to shards and to a file.
func TestPackSampleLargerThanStaging(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	var w want
	for i, n := range []int{100, 33<<20 + 3, 5, 17 << 20} {
		b := randBytes(rng, n)
		name := fmt.Sprintf("%d", i)
		os.WriteFile(filepath.Join(src, name), b, 0o644)
		w.add(name, b)
	}
	checkPackRuns(t, src, "files", Options{}, w, 1)
	tgz := filepath.Join(dir, "big.tgz")
	writeTar(t, tgz, true, w.names, w.samples)
	checkPackRuns(t, tgz, "tar.gz", Options{}, w, 1)
}

// A cancelled context stops a pack and publishes nothing.
func TestPackCancelPublishesNothing(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	for i := range 50 {
		os.WriteFile(filepath.Join(src, fmt.Sprint(i)), bytes.Repeat([]byte{byte(i)}, 1000), 0o644)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Open(ctx, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 0
	_, err = Pack(ctx, s, filepath.Join(dir, "out"), Config{ShardSize: 4096, Progress: func(samples, _ int64) {
		if n++; n == 10 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("pack after cancel: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("cancelled pack left %v", ents)
	}
}

// A Parquet page larger than arrow-go's default 64 MiB limit (writers put
// a row group of images in one page) still packs.
func TestSourceParquetLargePage(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	dir := t.TempDir()
	sc := arrow.NewSchema([]arrow.Field{{Name: "img", Type: arrow.BinaryTypes.Binary}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	var w want
	for i := range 65 {
		v := randBytes(rng, 1<<20)
		b.Field(0).(*array.BinaryBuilder).Append(v)
		w.add(fmt.Sprintf("big.parquet:%d", i), v)
	}
	rec := b.NewRecordBatch()
	p := filepath.Join(dir, "big.parquet")
	f, _ := os.Create(p)
	props := parquet.NewWriterProperties(parquet.WithDataPageSize(1<<30), parquet.WithDictionaryDefault(false))
	pw, err := pqarrow.NewFileWriter(sc, f, props, pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	checkPackRuns(t, p, "parquet", Options{Column: "img"}, w, 1)
}
