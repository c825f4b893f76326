package client

import (
	"sync"
	"sync/atomic"
)

// ReadStats counts a Client's batched read path, so benchmarks can report
// how a batch of sample reads turned into storage requests: requests per
// batch is Requests/Calls, bytes per request Bytes/Requests.
type ReadStats struct {
	// Calls is the number of ReadChunks calls (one per fs.FS.ReadBatch).
	Calls int64 `json:"calls"`
	// Requests is the number of BatchRead requests sent to storage
	// services (retries included).
	Requests int64 `json:"requests"`
	// IOs is the number of chunk ranges in those requests, after
	// neighbouring ranges were merged.
	IOs int64 `json:"ios"`
	// Bytes is the number of bytes those requests asked for.
	Bytes int64 `json:"bytes"`
	// LocalBytes is the part of Bytes the client read itself from chunk
	// files on this host (short-circuit reads, Options.NoLocalReads).
	LocalBytes int64 `json:"local_bytes"`
}

// Sub returns s - o (the activity between two snapshots).
func (s ReadStats) Sub(o ReadStats) ReadStats {
	return ReadStats{Calls: s.Calls - o.Calls, Requests: s.Requests - o.Requests, IOs: s.IOs - o.IOs, Bytes: s.Bytes - o.Bytes, LocalBytes: s.LocalBytes - o.LocalBytes}
}

// RequestsPerCall is Requests / Calls (0 without calls).
func (s ReadStats) RequestsPerCall() float64 {
	if s.Calls == 0 {
		return 0
	}
	return float64(s.Requests) / float64(s.Calls)
}

// BytesPerRequest is Bytes / Requests (0 without requests).
func (s ReadStats) BytesPerRequest() float64 {
	if s.Requests == 0 {
		return 0
	}
	return float64(s.Bytes) / float64(s.Requests)
}

type readCounters struct {
	calls, requests, ios, bytes, local atomic.Int64
}

// counters holds each Client's read counters, beside the Client so that
// counting needs no change to its struct. An entry lives as long as the
// process (a few words per Client ever dialled).
var counters sync.Map // *Client -> *readCounters

func (c *Client) readCounters() *readCounters {
	if v, ok := counters.Load(c); ok {
		return v.(*readCounters)
	}
	v, _ := counters.LoadOrStore(c, &readCounters{})
	return v.(*readCounters)
}

func (c *Client) countReadCall() { c.readCounters().calls.Add(1) }

func (c *Client) countReadRequest(ios int, bytes int64) {
	rc := c.readCounters()
	rc.requests.Add(1)
	rc.ios.Add(int64(ios))
	rc.bytes.Add(bytes)
}

func (c *Client) countLocalRead(bytes int64) { c.readCounters().local.Add(bytes) }

// ReadStats returns the counts of the batched read path so far.
func (c *Client) ReadStats() ReadStats {
	rc := c.readCounters()
	return ReadStats{Calls: rc.calls.Load(), Requests: rc.requests.Load(), IOs: rc.ios.Load(), Bytes: rc.bytes.Load(), LocalBytes: rc.local.Load()}
}
