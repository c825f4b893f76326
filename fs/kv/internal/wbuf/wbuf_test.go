package wbuf

import (
	"fmt"
	"testing"
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
