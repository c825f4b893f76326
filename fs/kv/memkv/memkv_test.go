package memkv

import (
	"testing"

	"github.com/ffkit/ffkit/fs/kv/kvtest"
)

func TestConformance(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	kvtest.Run(t, s, kvtest.Options{Writers: 8, Increments: 50})
}
