package pack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/fs"
)

// writeParquetColumn writes vals as column "v" (after an int64 column
// "id") of a Parquet file; a nil entry with null is a NULL.
func writeParquetColumn(t *testing.T, p string, typ arrow.DataType, nullable bool, vals [][]byte, props ...parquet.WriterProperty) {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}, {Name: "v", Type: typ, Nullable: nullable}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for i, v := range vals {
		b.Field(0).(*array.Int64Builder).Append(int64(i))
		switch fb := b.Field(1).(type) {
		case *array.BinaryBuilder:
			if v == nil && nullable {
				fb.AppendNull()
			} else {
				fb.Append(v)
			}
		case *array.StringBuilder:
			fb.Append(string(v))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pw, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(props...), pqarrow.DefaultWriterProps())
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

// packedFiles packs src (opened with column "v") into a directory and a
// .ffr file under out and returns every output file's bytes by name.
func packedFiles(t *testing.T, src, out string) (files map[string][]byte, listedSrc bool) {
	t.Helper()
	ctx := context.Background()
	files = map[string][]byte{}
	for _, target := range []string{"ds", "one.ffr"} {
		s, err := Open(ctx, src, Options{Column: "v"})
		if err != nil {
			t.Fatal(err)
		}
		_, listedSrc = s.(Listed)
		dst := filepath.Join(out, target)
		_, err = Pack(ctx, s, dst, Config{ShardSize: 256 << 10, Align: AlignAuto, Workers: 3})
		s.Close()
		if err != nil {
			t.Fatalf("pack %s -> %s: %v", src, target, err)
		}
		ms, _ := filepath.Glob(filepath.Join(out, "*", "*"))
		ms2, _ := filepath.Glob(filepath.Join(out, "one.ffr*"))
		for _, m := range append(ms, ms2...) {
			b, err := os.ReadFile(m)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(out, m)
			files[rel] = b
		}
	}
	return files, listedSrc
}

// A Parquet column is listed (its values read straight into place, or cut
// from their decompressed page) when its pages are uncompressed or snappy,
// PLAIN or dictionary-encoded, in every page layout writers use, and packs
// into exactly the bytes the walk over the same column gives; a column
// stored otherwise is walked.
func TestParquetListedSameBytesAsWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	dir := t.TempDir()
	var vals, squeezy [][]byte
	for i := range 200 {
		n := rng.IntN(16 << 10)
		if i%17 == 0 {
			n = 0
		}
		vals = append(vals, randBytes(rng, n))
		// Values that snappy compresses (copies among the literals), of
		// equal sizes (their length prefixes repeat, so snappy copies them).
		v := randBytes(rng, 6<<10)
		for j := 0; j < len(v)-64; j += 512 + rng.IntN(512) {
			copy(v[j:j+48], v[:48])
		}
		squeezy = append(squeezy, v)
	}
	blobs := [][]byte{randBytes(rng, 6<<10), randBytes(rng, 9<<10), randBytes(rng, 5<<10)}
	// Small write batches: the writer checks page and dictionary sizes
	// after each, so chunks have several pages and dictionaries fall back.
	plain := []parquet.WriterProperty{parquet.WithDictionaryDefault(false), parquet.WithDataPageSize(64 << 10), parquet.WithMaxRowGroupLength(70), parquet.WithBatchSize(4)}
	snappy := parquet.WithCompression(compress.Codecs.Snappy)
	v2 := parquet.WithDataPageVersion(parquet.DataPageV2)
	cases := []struct {
		name     string
		typ      arrow.DataType
		nullable bool
		props    []parquet.WriterProperty
		listed   bool
		vals     string // "", "repeats" (a few distinct values: a writer then keeps the dictionary), "squeezy", "empty" (no rows)
	}{
		{"required-v1", arrow.BinaryTypes.Binary, false, plain, true, ""},
		{"optional-v1", arrow.BinaryTypes.Binary, true, plain, true, ""},
		{"optional-v2", arrow.BinaryTypes.Binary, true, append(plain, v2), true, ""},
		{"string-v2-no-stats", arrow.BinaryTypes.String, false, append(plain, v2, parquet.WithStats(false)), true, ""},
		{"one-page-per-group", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithDictionaryDefault(false), parquet.WithDataPageSize(1 << 30)}, true, ""},
		{"empty", arrow.BinaryTypes.Binary, false, plain, false, "empty"},
		{"dictionary", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70)}, true, "repeats"},
		// pyarrow's defaults: snappy, a dictionary (falling back to PLAIN
		// pages when it grows past its limit)
		{"snappy", arrow.BinaryTypes.Binary, false, append(plain, snappy), true, ""},
		{"snappy-optional-v1", arrow.BinaryTypes.Binary, true, append(plain, snappy), true, ""},
		{"snappy-optional-v2", arrow.BinaryTypes.Binary, true, append(plain, snappy, v2), true, ""},
		{"snappy-dictionary", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70), snappy}, true, ""},
		{"snappy-dictionary-fallback", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70), snappy, parquet.WithDictionaryPageSizeLimit(100 << 10), parquet.WithDataPageSize(32 << 10), parquet.WithBatchSize(4)}, true, ""},
		{"snappy-dictionary-repeats", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70), snappy}, true, "repeats"},
		{"snappy-squeezy", arrow.BinaryTypes.Binary, false, append(plain, snappy), true, "squeezy"},
		{"snappy-squeezy-dictionary", arrow.BinaryTypes.String, true, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70), snappy}, true, "squeezy"},
		// another codec: decoded ahead by the walk
		{"zstd-optional-v2", arrow.BinaryTypes.Binary, true, append(plain, parquet.WithCompression(compress.Codecs.Zstd), v2), false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name+".parquet")
			vals := vals
			switch c.vals {
			case "empty":
				vals = nil
			case "squeezy":
				vals = squeezy
			case "repeats":
				vals = make([][]byte, len(vals))
				for i := range vals {
					vals[i] = blobs[i%len(blobs)]
				}
			}
			writeParquetColumn(t, p, c.typ, c.nullable, vals, c.props...)
			check := func(got map[string][]byte, isListed bool, out string) {
				t.Helper()
				if got := readDataset(t, filepath.Join(out, "ds")); len(got) != len(vals) {
					t.Fatalf("%d samples, want %d", len(got), len(vals))
				} else {
					for i := range got {
						if string(got[i]) != string(vals[i]) {
							t.Fatalf("sample %d: %d bytes differ from the value's %d", i, len(got[i]), len(vals[i]))
						}
					}
				}
				if isListed != c.listed {
					t.Fatalf("listed source: %v, want %v", isListed, c.listed)
				}
			}
			rowGroupsDecodedAhead.Store(0)
			pagesDecoded.Store(0)
			got, isListed := packedFiles(t, p, filepath.Join(dir, c.name, "new"))
			check(got, isListed, filepath.Join(dir, c.name, "new"))
			if ahead := rowGroupsDecodedAhead.Load() > 0; ahead != (!c.listed && c.vals != "empty") {
				t.Fatalf("row groups decoded ahead: %v, want %v", ahead, !c.listed && c.vals != "empty")
			}
			if decoded := pagesDecoded.Load() > 0; decoded {
				t.Fatal("pages decompressed whole: their values are assembled alone")
			}
			var cuts []map[string][]byte
			if c.listed && strings.HasPrefix(c.name, "snappy") { // every value decompressed alone, then cut from its decompressed page
				for _, assemble := range []bool{true, false} {
					snappyDirect, assembleValues = false, assemble
					pagesDecoded.Store(0)
					out := filepath.Join(dir, c.name, fmt.Sprint("cut-", assemble))
					cut, isListed := packedFiles(t, p, out)
					snappyDirect, assembleValues = true, true
					check(cut, isListed, out)
					if decoded := pagesDecoded.Load() > 0; decoded == assemble {
						t.Fatalf("values assembled %v, pages decompressed whole: %v", assemble, decoded)
					}
					cuts = append(cuts, cut)
					if assemble {
						checkCutReads(t, p, vals)
					}
				}
			}
			oldMin, oldMax := listParquetMinValue, parallelRowGroupMax
			listParquetMinValue = 1 << 62 // the walk, as before listing,
			parallelRowGroupMax = -1      // on one goroutine
			defer func() { listParquetMinValue, parallelRowGroupMax = oldMin, oldMax }()
			walked, isListed := packedFiles(t, p, filepath.Join(dir, c.name, "walk"))
			if isListed {
				t.Fatal("the walk's source is listed")
			}
			if len(got) != len(walked) || len(got) < 4 {
				t.Fatalf("files %d, walked %d", len(got), len(walked))
			}
			for name, b := range walked {
				if string(got[name]) != string(b) {
					t.Fatalf("%s: %d bytes differ from the walk's %d", name, len(got[name]), len(b))
				}
				for _, cut := range cuts {
					if string(cut[name]) != string(b) {
						t.Fatalf("%s, every value cut from its page: %d bytes differ from the walk's %d", name, len(cut[name]), len(b))
					}
				}
			}
		})
	}
}

// checkCutReads reads every value of the snappy Parquet file p that is
// not read straight from the file (decompressed alone) in pieces at random
// places, as Pack's workers do when a value straddles two staging chunks.
func checkCutReads(t *testing.T, p string, vals [][]byte) {
	t.Helper()
	fsys, name, err := fs.Resolve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	snappyDirect = false
	l, err := listParquetPages(context.Background(), fsys, name, "v")
	snappyDirect = true
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(uint64(len(vals)), 3))
	n := 0
	for i, c := range l.cut {
		if c.unit < 0 || len(vals[i]) == 0 {
			continue
		}
		n++
		got := make([]byte, len(vals[i]))
		for off := 0; off < len(got); {
			k := 1 + rng.IntN(len(got)-off)
			if m, err := l.ReaderAt(i).ReadAt(got[off:off+k], int64(off)); m != k || (err != nil && err != io.EOF) {
				t.Fatalf("value %d at %d: %d of %d bytes, %v", i, off, m, k, err)
			}
			off += k
		}
		if string(got) != string(vals[i]) {
			t.Fatalf("value %d read in pieces differs", i)
		}
		l.Done(i)
	}
	if n == 0 {
		t.Fatal("no value decompressed alone")
	}
}

// A NULL value in a listable column makes the column walked, which names
// the row; a column of short values is walked; a value whose length was
// corrupted fails the pack, publishing nothing.
func TestParquetListFallsBack(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, 14))
	dir := t.TempDir()
	plain := []parquet.WriterProperty{parquet.WithDictionaryDefault(false), parquet.WithDataPageSize(64 << 10), parquet.WithMaxRowGroupLength(70)}
	var vals [][]byte
	for range 200 {
		vals = append(vals, randBytes(rng, 8<<10))
	}
	for _, v := range []struct{ v2, snappy, dict bool }{{false, false, false}, {true, false, false}, {false, true, false}, {true, true, false}, {false, true, true}} {
		props := append([]parquet.WriterProperty(nil), plain...)
		if v.v2 {
			props = append(props, parquet.WithDataPageVersion(parquet.DataPageV2))
		}
		if v.snappy {
			props = append(props, parquet.WithCompression(compress.Codecs.Snappy))
		}
		if v.dict {
			props = append(props, parquet.WithDictionaryDefault(true))
		}
		nulls := append([][]byte(nil), vals...)
		nulls[123] = nil
		p := filepath.Join(dir, fmt.Sprintf("nulls-%v.parquet", v))
		writeParquetColumn(t, p, arrow.BinaryTypes.Binary, true, nulls, props...)
		s, err := Open(ctx, p, Options{Column: "v"})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.(Listed); ok {
			t.Fatal("a column with a NULL is listed")
		}
		_, err = Pack(ctx, s, filepath.Join(dir, "nulls-out"), Config{})
		s.Close()
		if !errors.Is(err, ErrData) || !strings.Contains(err.Error(), "row 123") {
			t.Fatalf("NULL at row 123: %v", err)
		}
	}
	short := make([][]byte, 500)
	for i := range short {
		short[i] = fmt.Appendf(nil, "caption %d", i)
	}
	p := filepath.Join(dir, "short.parquet")
	writeParquetColumn(t, p, arrow.BinaryTypes.String, false, short, plain...)
	if s, err := Open(ctx, p, Options{Column: "v"}); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(Listed); ok {
		t.Fatal("a column of short strings is listed")
	}

	// Corrupt one value's length: the listing no longer adds up, the walk
	// reads the page and fails.
	p = filepath.Join(dir, "corrupt.parquet")
	writeParquetColumn(t, p, arrow.BinaryTypes.Binary, false, vals, plain...)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	fsys, name, err := fs.Resolve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	l, err := listParquet(ctx, fsys, name, "v")
	if err != nil {
		t.Fatal(err)
	}
	e := l.ext1[100]
	l.Close()
	b[e.off-1] ^= 0x40 // the high byte of value 100's length: a length far past its page
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	packFailsUnlisted(t, p, filepath.Join(dir, "corrupt-out"), "a column with a corrupt length")

	// The same in a snappy page: the listing of the corrupt stream (its
	// literal lengths no longer add up) fails, the walk fails the pack.
	p = filepath.Join(dir, "corrupt-snappy.parquet")
	writeParquetColumn(t, p, arrow.BinaryTypes.Binary, false, vals, append(plain, parquet.WithCompression(compress.Codecs.Snappy))...)
	if b, err = os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	pl, err := listParquetPages(ctx, fsys, p, "v")
	if err != nil {
		t.Fatal(err)
	}
	e = pl.extents[100][0]
	pl.Close()
	b[e.off-1] ^= 0x40 // the high byte of value 100's length, in a literal
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	packFailsUnlisted(t, p, filepath.Join(dir, "corrupt-snappy-out"), "a snappy column with a corrupt length")
}

// packFailsUnlisted: column v of the Parquet file p is not listed, its
// pack to out fails, and nothing is left at out.
func packFailsUnlisted(t *testing.T, p, out, what string) {
	t.Helper()
	s, err := Open(context.Background(), p, Options{Column: "v"})
	if err == nil {
		if _, ok := s.(Listed); ok {
			t.Fatalf("%s is listed", what)
		}
		_, err = Pack(context.Background(), s, out, Config{})
		s.Close()
	}
	if err == nil {
		t.Fatalf("%s packed", what)
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Fatalf("a failed pack (%v) left %s", err, out)
	}
}
