package scan

import (
	"math/rand"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/compute"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// takeRows gives what compute.Take gives, for every column type of the
// test table (nulls, strings, decimals, booleans, timestamps) and for
// sliced batches (non-zero array offsets).
func TestTakeRowsMatchesComputeTake(t *testing.T) {
	db := openDuck(t)
	in := filepath.Join(t.TempDir(), "t.parquet")
	genDuck(t, db, in, 5000, 5000)
	pf, err := OpenFile(bg, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	rec, err := pf.ReadRowGroup(bg, 0, allPos(pf.Schema.NumFields()))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	rng := rand.New(rand.NewSource(1))
	for _, r := range []arrow.RecordBatch{rec, rec.NewSlice(1234, 4321)} {
		n := int(r.NumRows())
		for _, m := range []int{0, 1, n / 3, 2 * n} {
			idx := make([]int32, m)
			for i := range idx {
				idx[i] = int32(rng.Intn(n))
			}
			got, err := takeRows(bg, r, idx)
			if err != nil {
				t.Fatal(err)
			}
			b := array.NewInt32Builder(memory.DefaultAllocator)
			b.AppendValues(idx, nil)
			ia := b.NewArray()
			d, err := compute.Take(bg, *compute.DefaultTakeOptions(), compute.NewDatum(r), compute.NewDatum(ia))
			if err != nil {
				t.Fatal(err)
			}
			want := d.(*compute.RecordDatum).Value
			if !array.RecordEqual(got, want) {
				t.Fatalf("offset %d, %d rows taken: takeRows differs from compute.Take", r.Column(0).Data().Offset(), m)
			}
			got.Release()
			want.Release()
			ia.Release()
			b.Release()
		}
	}
	if r := rec.NewSlice(1234, 4321); r.Column(0).Data().Offset() == 0 {
		t.Fatal("slice has no offset: the offset case is not exercised")
	} else {
		r.Release()
	}
}
