package wbuf

import (
	"fmt"
	"testing"

	"github.com/ffkit/ffkit/fs/kv"
)

func TestNormalized(t *testing.T) {
	var b Buffer
	b.Set([]byte("a"), []byte("1"))
	b.DeleteRange([]byte("b"), []byte("f"))
	b.DeleteRange([]byte("e"), []byte("h"))
	b.Set([]byte("c"), []byte("2"))
	b.Delete([]byte("d")) // inside a range: dropped
	b.Delete([]byte("z"))
	b.DeleteRange([]byte("x"), nil)
	ranges, keys, ops := b.Normalized()
	got := ""
	for _, r := range ranges {
		got += fmt.Sprintf("[%s,%s)", r.Begin, r.End)
	}
	for i, k := range keys {
		got += fmt.Sprintf(" %s=%s/%v", k, ops[i].Value, ops[i].Delete)
	}
	want := "[b,c)[c\x00,h)[x,) a=1/false c=2/false"
	if got != want {
		t.Fatalf("Normalized = %q, want %q", got, want)
	}
}

func TestRangeReadShape(t *testing.T) {
	var b Buffer
	if got := b.StoreLimit([]byte("a"), []byte("m"), 3); got != 3 {
		t.Fatalf("StoreLimit with no writes = %d, want 3", got)
	}
	b.Set([]byte("c"), []byte("1"))
	if got := b.StoreLimit([]byte("a"), []byte("m"), 3); got != 0 {
		t.Fatalf("StoreLimit with a write in range = %d, want 0 (all)", got)
	}
	if got := b.StoreLimit([]byte("m"), nil, 3); got != 3 {
		t.Fatalf("StoreLimit with writes elsewhere = %d, want 3", got)
	}

	out := []kv.KeyValue{{Key: []byte("b")}, {Key: []byte("d")}}
	r := Observed([]byte("a"), []byte("m"), 2, out)
	if string(r.Begin) != "a" || string(r.End) != "d\x00" {
		t.Fatalf("Observed at the limit = [%q,%q), want [a, d\\x00)", r.Begin, r.End)
	}
	r = Observed([]byte("a"), nil, 3, out) // fewer than the limit: all seen
	if string(r.Begin) != "a" || r.End != nil {
		t.Fatalf("Observed under the limit = [%q,%q), want [a, nil)", r.Begin, r.End)
	}
	begin := []byte("a")
	r = Observed(begin, nil, 0, out)
	begin[0] = 'z'
	if string(r.Begin) != "a" {
		t.Fatal("Observed shares the caller's begin slice")
	}
}
