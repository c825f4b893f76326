//go:build fdb

package fdbkv

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/kvtest"
)

// TestConformance runs the kv suite against the FoundationDB cluster named
// by $FFKIT_FDB_CLUSTER_FILE (skipped when unset). Keys live under a fresh
// prefix per run.
func TestConformance(t *testing.T) {
	cf := os.Getenv("FFKIT_FDB_CLUSTER_FILE")
	if cf == "" {
		t.Skip("set FFKIT_FDB_CLUSTER_FILE to a FoundationDB cluster file to run the conformance suite")
	}
	s, err := Open(Options{ClusterFile: cf, MaxRetries: 20, Prefix: fmt.Sprintf("ffkit-test-%d/", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kvtest.Run(t, s, kvtest.Options{})
}
