package scan

import (
	"testing"

	"github.com/ffkit/ffkit/scan/expr"
)

// The integer group table against a Go map, across many growths.
func TestIntTable(t *testing.T) {
	p := &aggPlan{keyKinds: []expr.Type{expr.TInt}, aggs: []aggSpec{{fn: "count", star: true}}}
	tab := newGroupTable(p)
	want := map[int64]int32{}
	n := 300000
	keys := expr.Vec{T: expr.TInt, I: make([]int64, n)}
	for i := range keys.I {
		keys.I[i] = int64((i*7919)%100003) - 50000
	}
	gids := tab.groups([]expr.Vec{keys}, n)
	for i, k := range keys.I {
		g, ok := want[k]
		if !ok {
			g = int32(len(want))
			want[k] = g
		}
		if gids[i] != g {
			t.Fatalf("row %d key %d: group %d, want %d", i, k, gids[i], g)
		}
	}
	if tab.n != len(want) {
		t.Fatalf("%d groups, want %d", tab.n, len(want))
	}
}
