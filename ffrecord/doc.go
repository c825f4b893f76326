// Package ffrecord reads and writes FFRecord files, byte-compatible with
// HFAiLab's FFRecord v1 (the reference, version 1.4.0).
//
// # The bytes
//
// All integers are little-endian. There is no magic number, no version and
// no padding; the file size is not recorded.
//
//	offset     size  field
//	0          4     uint32 header checksum: CRC-32 (IEEE) of bytes [4, 12+12n);
//	                 0 marks a legacy file whose header is not checked
//	4          8     int64 n, the number of samples (0 allowed)
//	12         4n    uint32 CRC-32 of each sample (an empty sample's is 0)
//	12+4n      8n    int64 absolute file offset of each sample
//	12+12n     ...   the samples' bytes, end to end, in index order
//
//	+--------+-----+-----------------+----------------------+----------+----------+---
//	| hdrCRC |  n  | crc[0..n)       | offset[0..n)         | sample 0 | sample 1 | ...
//	+--------+-----+-----------------+----------------------+----------+----------+---
//	0        4     12                12+4n                  12+12n
//
// Sample i spans [offset[i], offset[i+1]); the last one ends at the file
// size. A dataset is one file, a directory of *.ffr files (not recursive,
// sorted by name as byte strings) or a list of both, concatenated: global
// sample index First(file)+i names sample i of a file.
//
// # Validation
//
// Open checks, before it allocates anything sized by the header, that n is
// plausible for the file size; it then checks the header checksum, that the
// offsets are monotonic, start after the header and lie inside the file.
// A file cut short is told from corrupt bytes wherever the size makes that
// knowable: the error names the first damaged or missing sample. A cut
// inside the last sample shows only as that sample's checksum mismatch,
// because the format does not record where the last sample ends.
//
// Every error about a sample is a *SampleError naming the file, the global
// and local sample index and the byte range; errors.Is tells ErrCorrupt,
// ErrChecksum and ErrTruncated (all errkind.Data) and ErrIndex (errkind.Usage).
//
// # Reading
//
// The Reader keeps only the header arrays (offsets and checksums, 12 bytes
// per sample) in memory. ReadBatch plans a batch: it sorts the requested
// samples by (file, offset), merges neighbours whose gap is below
// ReadOptions.MergeGap into one read, issues the reads through the file
// system's batched read with bounded parallelism, scatters the bytes,
// verifies every sample's CRC-32 and returns the samples in request order.
//
// Ownership: ReadBatch returns freshly allocated samples the caller owns;
// ReadBatchInto returns subslices of the caller's buffer, valid as long as
// the caller keeps the buffer unchanged. The Reader keeps no reference to
// either. All Reader methods are safe for concurrent use.
//
// # Writing
//
// Create writes one file of n samples known up front and produces exactly
// the bytes the reference writer produces. NewShardedWriter needs no n: it
// rolls to a new file (PART_00000.ffr, ...) at a target size; given every
// sample's size in advance (ShardOptions.Sizes) it streams instead of
// buffering a shard; without Sizes, a sample too large to share a shard is
// streamed, so memory stays bounded by the shard size, not the sample. Both
// write through fs.FS Create: under a temporary name, synced, renamed into
// place on success. The sharded writer writes all its shards (and files
// added with CreateFile) into a hidden staging directory beside the output
// and publishes it with one directory rename, setting an old dataset aside
// first (publish.go), so a crash at any point leaves the old dataset, the
// new one or nothing at the output, never a prefix or a mix; Clean removes
// what a killed writer left. Samples of any size stream through a bounded
// staging window; Reserve takes at most MaxReserve bytes. WriterOptions.Align may start the data on a page
// boundary (not the reference's bytes, read by every reader) so that
// page-sized samples are single O_DIRECT reads.
//
// Samples can be appended from bytes (WriteOne), from a reader (WriteFrom,
// WriteFromAt: copied once, straight into the output, checksummed on the
// way), or reserved (Reserve: other goroutines fill the sample's space in
// the output and report its CRC; samples land in reservation order). A
// Writer belongs to one goroutine; Reserve's done callbacks may run on any.
package ffrecord
