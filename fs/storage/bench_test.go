package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
)

// BenchmarkChainWrites writes 4 KiB at random offsets of different
// chunks of one chain of three replicas (three in-process storage
// services on real files) with 1, 4 and 16 concurrent writers: do writes
// to independent chunks of one chain scale? It needs nothing beyond this
// package's exported API and the client, so the same file runs on an
// older tree as the same-run baseline (see docs/perf/storage.md).
func BenchmarkChainWrites(b *testing.B) {
	ctx := context.Background()
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 3, ExpectTargets: 3,
		HeartbeatInterval: 100 * time.Millisecond, FailTimeout: 10 * time.Second, UpdateInterval: 50 * time.Millisecond, Logf: func(string, ...any) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	dir := b.TempDir()
	for n := 1; n <= 3; n++ {
		s, err := Start(Config{Node: proto.NodeID(n), Mgmtd: []string{m.Addr()}, Token: "tok", Logf: func(string, ...any) {},
			Targets: []TargetConfig{{ID: proto.TargetID(n), Dir: filepath.Join(dir, fmt.Sprint(n))}}})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
	}
	fstest.WaitReady(b, m, time.Minute)
	cl, err := client.Dial(ctx, []string{m.Addr()}, client.Options{Token: "tok", RetryTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	payload := make([]byte, 4096)
	for _, writers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			b.SetBytes(int64(len(payload)))
			g, gctx := errgroup.WithContext(ctx)
			for w := 0; w < writers; w++ {
				g.Go(func() error {
					for i := w; i < b.N; i += writers {
						off := int64(i*7919%256) * 4096 // within a 1 MiB chunk
						if err := cl.WriteChunk(gctx, 1, proto.ChunkID{Inode: uint64(100 + writers), Index: uint64(w)}, off, payload); err != nil {
							return err
						}
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
