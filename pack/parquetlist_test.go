package pack

import (
	"context"
	"errors"
	"fmt"
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

// A Parquet column of uncompressed PLAIN pages is listed (its values read
// straight into place), in every page layout writers use, and packs into
// exactly the bytes the walk over the same column gives; a column stored
// otherwise is walked.
func TestParquetListedSameBytesAsWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	dir := t.TempDir()
	var vals [][]byte
	for i := range 200 {
		n := rng.IntN(16 << 10)
		if i%17 == 0 {
			n = 0
		}
		vals = append(vals, randBytes(rng, n))
	}
	blobs := [][]byte{randBytes(rng, 6<<10), randBytes(rng, 9<<10), randBytes(rng, 5<<10)}
	plain := []parquet.WriterProperty{parquet.WithDictionaryDefault(false), parquet.WithDataPageSize(64 << 10), parquet.WithMaxRowGroupLength(70)}
	cases := []struct {
		name     string
		typ      arrow.DataType
		nullable bool
		props    []parquet.WriterProperty
		listed   bool
		repeats  bool // a few distinct values (a writer then keeps the dictionary)
		empty    bool // no rows
	}{
		{"required-v1", arrow.BinaryTypes.Binary, false, plain, true, false, false},
		{"optional-v1", arrow.BinaryTypes.Binary, true, plain, true, false, false},
		{"optional-v2", arrow.BinaryTypes.Binary, true, append(plain, parquet.WithDataPageVersion(parquet.DataPageV2)), true, false, false},
		{"string-v2-no-stats", arrow.BinaryTypes.String, false, append(plain, parquet.WithDataPageVersion(parquet.DataPageV2), parquet.WithStats(false)), true, false, false},
		{"one-page-per-group", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithDictionaryDefault(false), parquet.WithDataPageSize(1 << 30)}, true, false, false},
		{"empty", arrow.BinaryTypes.Binary, false, plain, false, false, true},
		{"dictionary", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70)}, false, true, false},
		{"snappy", arrow.BinaryTypes.Binary, false, append(plain, parquet.WithCompression(compress.Codecs.Snappy)), false, false, false},
		// pyarrow's defaults: a dictionary (falling back to PLAIN pages
		// when it grows), snappy; and zstd, NULL-able: decoded ahead
		{"snappy-dictionary", arrow.BinaryTypes.Binary, false, []parquet.WriterProperty{parquet.WithMaxRowGroupLength(70), parquet.WithCompression(compress.Codecs.Snappy)}, false, false, false},
		{"zstd-optional-v2", arrow.BinaryTypes.Binary, true, append(plain, parquet.WithCompression(compress.Codecs.Zstd), parquet.WithDataPageVersion(parquet.DataPageV2)), false, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name+".parquet")
			vals := vals
			if c.empty {
				vals = nil
			}
			if c.repeats {
				vals = make([][]byte, len(vals))
				for i := range vals {
					vals[i] = blobs[i%len(blobs)]
				}
			}
			writeParquetColumn(t, p, c.typ, c.nullable, vals, c.props...)
			rowGroupsDecodedAhead.Store(0)
			got, isListed := packedFiles(t, p, filepath.Join(dir, c.name, "new"))
			if got := readDataset(t, filepath.Join(dir, c.name, "new", "ds")); len(got) != len(vals) {
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
			if ahead := rowGroupsDecodedAhead.Load() > 0; ahead != (!c.listed && !c.empty) {
				t.Fatalf("row groups decoded ahead: %v, want %v", ahead, !c.listed && !c.empty)
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
			}
		})
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
	for _, v2 := range []bool{false, true} {
		props := plain
		if v2 {
			props = append(props, parquet.WithDataPageVersion(parquet.DataPageV2))
		}
		nulls := append([][]byte(nil), vals...)
		nulls[123] = nil
		p := filepath.Join(dir, fmt.Sprintf("nulls-%v.parquet", v2))
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
	out := filepath.Join(dir, "corrupt-out")
	s, err := Open(ctx, p, Options{Column: "v"})
	if err == nil {
		if _, ok := s.(Listed); ok {
			t.Fatal("a column with a corrupt length is listed")
		}
		_, err = Pack(ctx, s, out, Config{})
		s.Close()
	}
	if err == nil {
		t.Fatal("a corrupt value length packed")
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Fatalf("a failed pack (%v) left %s", err, out)
	}
}
