// Package scan runs SmallPond-style columnar jobs over Parquet files, on a
// local disk or on the ffkit cluster: every byte goes through the fs.FS
// interface.
//
// # Reading
//
// OpenFile decodes a file's footer (validated: every column chunk must lie
// inside the data area, so a truncated file fails at open with ErrCorrupt
// naming it). File.ReadRowGroup decodes the chosen top-level columns of one
// row group into an Arrow record batch: flat fixed-width columns (int32,
// int64, float32, float64, date32) through parquet-go's page API
// (fastpath.go), everything else through arrow-go's pqarrow. Scans prune
// whole row groups whose min/max/null-count statistics rule the filter out
// (expr.MayMatch); when the filter reads one column that has a page index,
// they also decode only the pages (of every projected column) whose column
// index does not rule them out. They read the filter's columns first and
// the other projected columns only for row groups where some row passes;
// a string filter column is decoded as a dictionary and the filter runs once
// per distinct value. When every column a filtered scan reads is flat and
// fixed-width, the flat decoder (flat.go) takes the row group: each chunk is
// a slice of the memory-mapped local file (mmap.go; a pread into a reused
// buffer otherwise), each page is decompressed into a reused buffer with a
// pooled zstd decoder, the filter runs on views of those buffers (a `col op
// constant` filter selects rows straight from the values), and only the
// kept rows of each column are copied into the output batch. Unfiltered
// whole-row-group reads of such columns hand the decoded buffer to the
// Arrow array; string columns read as dictionaries (filters, group keys)
// are decoded from the dictionary page and the bit-packed indices
// (flatdict.go). Row groups are decoded in parallel (Workers) and
// handed on in input order. For remote files (and local ones with CoalesceLocal) a row group's
// column chunks are fetched first with reads merged across holes up to
// CoalesceGap, all issued in one fs.ReadBatch, so the storage runs them in
// parallel. Decoders (and their decompression buffers) are reused across
// row groups. Bytes read are counted at the fs.File boundary.
//
// Scan is the Go API for Arrow record batches out:
//
//	st, err := scan.Scan(ctx, []string{"data/"}, scan.ScanOptions{
//		Columns: "id, score * 2 AS s2", Where: "lang = 'en' AND score > 0.9"},
//		func(rec arrow.RecordBatch) error { ...; return nil })
//
// # Jobs
//
// Run runs a Job, a small DAG as in SmallPond:
//
//	read (files, globs, directories)
//	  -> partition: one partition, by files, by rows (cut at row offsets), or
//	     by the hash of columns into N (see hash.go for the exact rule)
//	  -> transform per partition: native filter / projection / computed
//	     columns, group-by aggregates (count, sum, min, max, mean; partial
//	     tables merged), or SQL through DuckDB with the partition as the
//	     table input (and input2, the second input hash-partitioned the
//	     same way, for a partition-wise join), with a per-task memory limit
//	  -> write Parquet (zstd level 3, 122,880-row row groups, dictionaries
//	     for strings, DELTA_BINARY_PACKED integers and dates, statistics
//	     and page index, the Arrow schema stored),
//	     FFRecord (one sample per row from a binary/string column), CSV,
//	     JSON lines, or an Arrow IPC file.
//
// A directory output holds part-PPPPP[-KKKKK].EXT files, at least one per
// partition (a partition that got no rows gets a schema-only file), and a
// _ffkit work directory: job.json (the job's fingerprint: a hash of the
// inputs' paths, sizes and modification times, the query and the options)
// and tasks/NAME.json, one marker per published task. Each task attempt
// writes into _ffkit/staging/TASK.FP.ATTEMPT, its files are renamed into
// place, and the marker is written last. A rerun of the same job skips the
// tasks with markers; a job with another fingerprint first removes the old
// part files and work directory, so stale partitions are never reused. A
// failed task is retried Retries times unless the error is bad data or bad
// usage. Parquet outputs carry the fingerprint, task and partition in their
// key-value metadata (KeyFingerprint, KeyPartition, ...). An output ending
// in the format's extension is one file; its parts are built in a hidden
// sibling directory and merged, and a rerun of a job whose output file
// already carries its fingerprint does nothing.
//
// # Serving Python without copies
//
// The engine runs in its own process, so Arrow C data pointers cannot
// cross into Python. A job with Format "arrow" (ffkit scan ... --format
// arrow -o /dev/shm/x.arrow --json) writes an uncompressed Arrow IPC file:
// pyarrow maps it with pa.ipc.open_file(pa.memory_map(path)).read_all()
// and gets a Table whose buffers point into the page cache (tmpfs for
// /dev/shm), without copying or decoding. The --json summary names the file.
//
// # Concurrency and ownership
//
// Run and Scan may be called concurrently. A File is safe for concurrent
// use. Record batches passed to Scan's callback are released after it
// returns. All goroutines are owned by errgroups and stopped before Run or
// Scan returns.
package scan

import "runtime"

func defaultWorkers() int { return runtime.NumCPU() }
