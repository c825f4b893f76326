package scan

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
)

// SortBy sorts each partition: natively for one binary, string or integer
// key (NULLs last, ties in input order), through DuckDB otherwise; the
// files hold the input's rows in key order.
func TestSortByPartition(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	var ins []string
	for f := 0; f < 3; f++ {
		in := filepath.Join(dir, fmt.Sprintf("in-%d.parquet", f))
		// 10-byte binary keys (some NULL, some equal, some 3 bytes: shorter
		// than the sort's 8-byte prefix), a string and an integer key
		mustExec(t, db, `COPY (SELECT i AS id,
			CASE WHEN i %% 53 = 0 THEN NULL WHEN i %% 41 = 0 THEN unhex('00ff00') ELSE unhex(left(md5((i %% 3000)::VARCHAR), 20)) END AS k,
			md5(i::VARCHAR) AS s, CASE WHEN i %% 31 = 0 THEN NULL ELSE (i * 7919 %% 1000) - 500 END AS n
			FROM range(%d, %d) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 2048)`, f*5000, f*5000+5000, in)
		ins = append(ins, in)
	}
	for _, tc := range []struct {
		by     []string
		native bool
	}{{[]string{"k"}, true}, {[]string{"s"}, true}, {[]string{"n"}, true}, {[]string{"n", "id"}, false}} {
		out := filepath.Join(dir, "sorted-"+strings.Join(tc.by, "-"))
		j := Job{Inputs: ins, PartitionBy: "files", Partitions: 3, SortBy: tc.by, Output: out, RowGroupRows: 3000, Compression: "snappy"}
		if _, err := Run(bg, j); err != nil {
			t.Fatal(err)
		}
		for p, in := range ins {
			f := filepath.Join(out, partName(p)+".parquet")
			sameAsDuck(t, db, f, fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(in)))
			// the rows in order, as DuckDB's ORDER BY (NULLs last) sees them
			pf, err := OpenFile(bg, f, nil)
			if err != nil {
				t.Fatal(err)
			}
			var prev string
			var prevNull, first = false, true
			rows := 0
			for rg := 0; rg < pf.NumRowGroups(); rg++ {
				rec, err := pf.ReadRowGroup(bg, rg, allPos(pf.Schema.NumFields()))
				if err != nil {
					t.Fatal(err)
				}
				col := rec.Column(pf.Schema.FieldIndices(tc.by[0])[0])
				for i := 0; i < col.Len(); i++ {
					null := col.IsNull(i)
					var v string
					switch c := col.(type) {
					case *array.Binary:
						v = string(c.Value(i))
					case *array.String:
						v = c.Value(i)
					case *array.Int64:
						v = fmt.Sprintf("%020d", c.Value(i)+1<<40)
					}
					if !first && (prevNull && !null || !prevNull && !null && bytes.Compare([]byte(prev), []byte(v)) > 0) {
						t.Fatalf("sort by %v: %s row %d is out of order (%q after %q)", tc.by, f, rows, v, prev)
					}
					prev, prevNull, first = v, null, false
					rows++
				}
				rec.Release()
			}
			pf.Close()
			if rows != 5000 {
				t.Fatalf("%s: %d rows", f, rows)
			}
		}
	}
	if n := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM parquet_metadata(%s) WHERE compression <> 'SNAPPY'",
		sqlString(filepath.Join(dir, "sorted-k", "*.parquet")))); n != 0 {
		t.Fatalf("%d column chunks not snappy", n)
	}
	// sort_by with SQL is a usage error
	_, err := Run(bg, Job{Inputs: ins, SortBy: []string{"k"}, SQL: "SELECT 1", Output: filepath.Join(dir, "x")})
	if err == nil || !strings.Contains(err.Error(), "sort_by") {
		t.Fatalf("sort_by with sql: %v", err)
	}
}

// radixSortPrefix orders by prefix, stably, as a comparison sort does:
// random prefixes, many equal ones, prefixes sharing their high or low
// bytes, and short inputs.
func TestRadixSortPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 1))
	gens := map[string]func() uint64{
		"random": rng.Uint64,
		"dups":   func() uint64 { return uint64(rng.IntN(50)) << 40 },
		"low":    func() uint64 { return uint64(rng.IntN(1000)) },
		"high":   func() uint64 { return uint64(rng.IntN(300)) << 52 },
		"same":   func() uint64 { return 7 },
	}
	for name, gen := range gens {
		for _, n := range []int{0, 1, 5, 255, 256, 1000, 70000} {
			ents := make([]ent, n)
			for i := range ents {
				ents[i] = ent{gen(), int32(i)}
			}
			want := slices.Clone(ents)
			slices.SortStableFunc(want, func(x, y ent) int { return cmp.Compare(x.pfx, y.pfx) })
			if got := radixSortPrefix(ents); !slices.Equal(got, want) {
				t.Fatalf("%s, %d entries: radix order differs from a stable sort", name, n)
			}
		}
	}
}
