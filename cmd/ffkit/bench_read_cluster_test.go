package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// On a real `ffkit fs up` cluster, `bench read` and `load` on an ffkit://
// dataset report how batches became storage requests: at least one request
// per batch, fewer requests than samples per batch (the batched path merges
// a batch's reads per storage service), and bytes in each request.
func TestBenchReadClusterRequestStats(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	u := startUp(t, t.TempDir())
	samples := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 11))
	for i := 0; i < 600; i++ {
		b := make([]byte, 256+rng.IntN(4096))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		os.WriteFile(filepath.Join(samples, fmt.Sprintf("s%05d.bin", i)), b, 0o644)
	}
	u.must(t, "pack", samples, "-o", u.url+"/ds", "--shard-size", "1M")

	const batch = 64
	out := u.must(t, "--json", "bench", "read", u.url+"/ds", "--batch-size", fmt.Sprint(batch),
		"--duration", "600ms", "--warmup", "100ms", "--rounds", "1", "--batches-in-flight", "2", "--parallelism", "4")
	var br struct {
		Batches                 int64   `json:"batches"`
		StorageRequestsPerBatch float64 `json:"storage_requests_per_batch"`
		BytesPerRequest         float64 `json:"bytes_per_request"`
		StorageRequests         int64   `json:"storage_requests"`
	}
	if err := json.Unmarshal([]byte(out), &br); err != nil {
		t.Fatalf("bench read --json: %v: %s", err, out)
	}
	t.Logf("bench read: %d batches, %.2f requests per batch of %d, %.0f bytes per request", br.Batches, br.StorageRequestsPerBatch, batch, br.BytesPerRequest)
	if br.Batches == 0 || br.StorageRequestsPerBatch < 1 || br.StorageRequestsPerBatch >= batch || br.BytesPerRequest <= 0 {
		t.Fatalf("bench read request stats: %s", out)
	}

	out = u.must(t, "--json", "load", u.url+"/ds", "--batch-size", fmt.Sprint(batch), "--shuffle")
	var ld struct {
		Batches                 int64   `json:"batches"`
		StorageRequestsPerBatch float64 `json:"storage_requests_per_batch"`
		BytesPerRequest         float64 `json:"bytes_per_request"`
	}
	if err := json.Unmarshal([]byte(out), &ld); err != nil {
		t.Fatalf("load --json: %v: %s", err, out)
	}
	t.Logf("load: %d batches, %.2f requests per batch, %.0f bytes per request", ld.Batches, ld.StorageRequestsPerBatch, ld.BytesPerRequest)
	if ld.Batches == 0 || ld.StorageRequestsPerBatch < 1 || ld.StorageRequestsPerBatch >= batch || ld.BytesPerRequest <= 0 {
		t.Fatalf("load request stats: %s", out)
	}
}
