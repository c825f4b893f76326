package kv_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/fs/kv"
	_ "github.com/ffkit/ffkit/fs/kv/memkv"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	s, err := kv.Open(ctx, "mem:")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, spec := range []string{"nope", "bogus:x", "fdb:/etc/foundationdb/fdb.cluster"} {
		_, err := kv.Open(ctx, spec)
		if !errors.Is(err, kv.ErrBadSpec) {
			t.Errorf("Open(%q) = %v, want ErrBadSpec", spec, err)
		}
		if strings.HasPrefix(spec, "fdb") && !strings.Contains(err.Error(), "-tags fdb") {
			t.Errorf("Open(%q) does not say how to get FoundationDB support: %v", spec, err)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ in, want string }{{"a", "b"}, {"a\xff", "b"}, {"\xff\xff", ""}, {"ab", "ac"}} {
		if got := string(kv.PrefixEnd([]byte(c.in))); got != c.want {
			t.Errorf("PrefixEnd(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
