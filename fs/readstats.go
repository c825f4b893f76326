package fs

// ReadStatser is an FS that counts how its batched read path (ReadBatch)
// turns batches of reads into requests to its storage services, so that
// benchmarks and the loader can report requests per batch and bytes per
// request. Callers discover it with a type assertion; local file systems
// do not implement it. fs/clusterfs implements it from the chunk client's
// counters.
type ReadStatser interface {
	// ReadStats returns the counts so far (monotonic; subtract two
	// snapshots for the activity between them).
	ReadStats() ReadStats
}

// ReadStats counts an FS's batched read path since it was opened.
type ReadStats struct {
	// Calls is the number of batched read calls.
	Calls int64 `json:"calls"`
	// Requests is the number of requests sent to storage services.
	Requests int64 `json:"requests"`
	// IOs is the number of ranges in those requests, after merging.
	IOs int64 `json:"ios"`
	// Bytes is the number of bytes those requests asked for.
	Bytes int64 `json:"bytes"`
	// LocalBytes is the part of Bytes read by short-circuit reads of
	// chunk files on this host, not sent over a connection.
	LocalBytes int64 `json:"local_bytes"`
}

// Add returns s + o.
func (s ReadStats) Add(o ReadStats) ReadStats {
	return ReadStats{Calls: s.Calls + o.Calls, Requests: s.Requests + o.Requests, IOs: s.IOs + o.IOs, Bytes: s.Bytes + o.Bytes, LocalBytes: s.LocalBytes + o.LocalBytes}
}

// Sub returns s - o.
func (s ReadStats) Sub(o ReadStats) ReadStats {
	return ReadStats{Calls: s.Calls - o.Calls, Requests: s.Requests - o.Requests, IOs: s.IOs - o.IOs, Bytes: s.Bytes - o.Bytes, LocalBytes: s.LocalBytes - o.LocalBytes}
}

// LocalShare is LocalBytes / Bytes (0 without bytes).
func (s ReadStats) LocalShare() float64 {
	if s.Bytes == 0 {
		return 0
	}
	return float64(s.LocalBytes) / float64(s.Bytes)
}

// BytesPerRequest is Bytes / Requests (0 without requests).
func (s ReadStats) BytesPerRequest() float64 {
	if s.Requests == 0 {
		return 0
	}
	return float64(s.Bytes) / float64(s.Requests)
}

// SumReadStats adds up the ReadStats of the distinct FSes among fsyses
// that implement ReadStatser; ok is false when none does.
func SumReadStats(fsyses []FS) (s ReadStats, ok bool) {
	seen := map[ReadStatser]bool{}
	for _, f := range fsyses {
		rs, is := f.(ReadStatser)
		if !is || seen[rs] {
			continue
		}
		seen[rs] = true
		s, ok = s.Add(rs.ReadStats()), true
	}
	return s, ok
}
