// Package pack turns samples from a source (a directory of files, a JSON
// Lines file, a tar or gzip tar archive, WebDataset tar shards, Parquet or
// Arrow tables) into an FFRecord dataset: one .ffr file, or a directory of
// shards published in one atomic step (see ffrecord's publish.go), with a
// sidecar index from each sample to its source name.
//
// Every source is read through package fs, so a source and the output may
// each be a local path or an ffkit:// URL.
//
// # Sources
//
// A Source lists samples in a stable order, each with a name (for the
// index) and a size known before its bytes are read, and hands each sample
// to a callback as a reader of exactly its bytes (Walk). Sources whose
// samples sit at known places in seekable files (a directory, JSON Lines,
// an uncompressed tar, WebDataset tar shards, a Parquet column of
// uncompressed or snappy pages: parquetlist.go, parquetpages.go) are also
// Listed: every sample is known up front and can be read at random
// (Listed.ReaderAt), so Pack reads many samples at once straight into their
// places in the output. Compressed archives and other tables are walked
// once, front to back.
//
// # The WebDataset container
//
// WebDataset groups tar members by key: 000123.jpg, 000123.json and
// 000123.cls are one sample with three fields. Packed with --format
// webdataset, such a sample's bytes are this container (all integers
// little-endian):
//
//	+--------+---------+-------+----------------------------------------+----------------+
//	| "FFWD" | version | count | count x (ext length u16, ext, size u64) | member bytes   |
//	| 4 B    | u32 = 1 | u32   | ext: the member's name after the key's | concatenated,  |
//	|        |         |       | first dot, lower case ("jpg", "seg.png")| in entry order |
//	+--------+---------+-------+----------------------------------------+----------------+
//
// DecodeWebDataset (and ffkit.decode_webdataset in Python) turn it back into
// a map from extension to bytes without copying them; FFRecord readers that
// know nothing of it still read the container's raw bytes.
//
// # Tables
//
// A Parquet or Arrow (IPC file or stream) table gives one sample per row:
// the bytes of the binary or string column named by Options.Column, or,
// without a column, the whole row as one JSON object (Arrow's JSON
// encoding of the row, without a newline). A NULL sample is an error.
//
// Concurrency: a Source belongs to one goroutine, except that a Listed
// source's ReaderAt results may be read from many at once.
package pack
