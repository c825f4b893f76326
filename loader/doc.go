// Package loader is ffkit's training data loader: it feeds one rank of a
// training job with batches of an FFRecord dataset (package ffrecord, over
// any fs.FS), or of a weighted mixture of datasets, epoch after epoch.
//
//	l, err := loader.Open(ctx, []string{"/data/train"}, loader.Options{
//		BatchSize: 256, Shuffle: true, Seed: 42, Rank: rank, WorldSize: world})
//	defer l.Close()
//	for {
//		b, err := l.Next(ctx)
//		if err == io.EOF { break }          // all epochs done
//		if err != nil { return err }        // names the sample and file
//		train(b.Samples, b.Seeds)
//		checkpoint(b.State())               // a few integers + fingerprint
//		b.Release()                         // the memory goes back to the pool
//	}
//
// # Order
//
// An epoch's order is a pure function of (seed, epoch, sample count, rank,
// world size, batch size, drop-last): it does not depend on worker count,
// prefetch depth, timing or resume points.
//
//   - Each epoch is an exact permutation of [0, n), computed on the fly by
//     a keyed bijection (Perm: an 8-round Feistel network over the next
//     power of two above n, with cycle walking into [0, n); for n <= 4096
//     an exactly uniform keyed Fisher-Yates table). No index array of the
//     dataset's size is ever built.
//   - The epoch's global stream is split as PyTorch's DistributedSampler
//     does: rank r takes stream positions r, r+W, r+2W, ... . Without
//     DropLast the stream is padded by wrapping (repeating its first
//     positions) to a multiple of W, and each rank's last batch may be
//     short; with DropLast only whole batches on every rank are delivered.
//     Every rank gets the same number of batches of the same sizes, so no
//     rank waits at the last step. Batch.Padded counts repeated entries.
//   - Every sample gets an augmentation seed SampleSeed(seed, epoch,
//     source, index), handed to SampleTransform and reported in
//     Batch.Seeds, so augmented batches are bit-identical whatever the
//     number of workers, and after a resume.
//
// # Resume, also on another world size
//
// Ranks advance in lockstep, so after k batches on every rank the consumed
// stream positions are exactly a prefix [0, cursor) of the epoch's stream.
// State is that cursor, the epoch and the seed, plus the dataset's
// fingerprint (per file: size, sample count, header checksum) and the
// order's parameters. Restore continues at the cursor: the rest of the
// stream is split again among the current ranks, so a state saved by any
// rank of a job of W ranks resumes a job of W' ranks with every remaining
// sample delivered exactly once across the new ranks (plus padding). A
// state of other data, another seed or another shuffle is refused with
// ErrState naming the difference. Fast-forward reads nothing.
//
// # Mixtures
//
// OpenMixture mixes datasets with Options.Weights. An epoch of
// MixtureEpoch items gives dataset j exactly round(MixtureEpoch*w_j/sum w)
// of them (largest remainder); the epoch's permutation interleaves them;
// the k-th draw of a dataset walks through it in passes, each a fresh
// permutation, so every sample of a dataset is seen before any is seen
// twice. It is the same pure function of (seed, epoch, position), so it is
// deterministic, rank-balanced and resumable like one dataset.
//
// # Block shuffle: locality against randomness
//
// On media where a random read costs much more than a sequential one
// (spinning disks, object stores, network file systems with large
// blocks), Options.BlockSize turns on a block shuffle: the dataset is cut
// into blocks of BlockSize consecutive samples, the order of the blocks is
// a global permutation, and the samples of each window of Window
// consecutive (permuted) blocks are permuted among themselves. A batch then
// draws from at most Window blocks, and the reads of one batch merge into
// few large reads; every sample is still delivered exactly once per epoch,
// and the order is still a pure function of the options.
//
// The price is randomness: the samples of one block arrive within the same
// window of BlockSize*Window deliveries, so consecutive batches share
// blocks, and a batch's samples are correlated if neighbouring samples are
// (a shard written from one source, one class, one document). Larger
// windows restore randomness and cost more distinct reads per batch.
// `ffkit load --block-size K --window W` prints both sides: read requests
// per batch after merging (locality) and the share of consecutive
// deliveries that are dataset neighbours (randomness); docs/perf/loader.md
// gives figures measured on this machine.
//
// # Reading
//
// A producer goroutine plans batches in order: it computes the batch's
// sample indices, sizes the batch, takes that many bytes from the memory
// budget and a buffer from the Arena, and queues the batch (at most
// 2*Prefetch batches ahead of the consumer). Prefetch reader goroutines
// take the queued batches in order, each going on to the next as soon as it
// is done, and read them through ffrecord's batch planner: requests sorted
// by (file, offset), neighbours merged, up to Workers reads in flight per
// batch, the samples verified (CRC-32, unless NoVerify) and returned in
// permutation order. Sample and batch transforms run after the read, sample transforms
// on up to TransformWorkers goroutines. Next hands batches out strictly in
// order and only when complete: the consumer never sees a partial batch.
//
// # Memory and ownership
//
// A batch's samples are subslices of one buffer, Batch.Data (Batch.Offset
// gives each sample's offset in it). The loader owns that buffer; the
// consumer may read it from Next until Batch.Release, after which it is
// reused for another batch. Release is idempotent and may be called from
// any goroutine, also after Close; batches held across Close stay valid
// until released. Transforms must not modify samples (a substituted sample
// shares bytes with the sample it repeats).
//
// MemoryBudget bounds the bytes of batch buffers held at once, counted from
// the moment a batch's buffer is taken until it is released, whether the
// batch waits in the prefetch queue or is held by the consumer. Memory is
// taken in batch order, so a full budget never deadlocks: the planner
// waits for the consumer to release. A batch larger than the whole budget
// is delivered alone (it waits until nothing else is held). A consumer
// that holds batches without releasing them stops the pipeline at the
// budget; the watchdog then says so.
//
// To put batches into memory the caller owns (shared memory that a Python
// process maps, as the ffkit Python package does), pass an Arena, for
// example NewSlabArena over that memory: Batch.Slot names the slot the
// batch lies in.
//
// # Errors, bad samples, stalls, shutdown
//
// A sample that fails (checksum, truncation, read error) reaches Next as an
// error wrapping *ffrecord.SampleError (file, global and local index, byte
// range) and the loader stops (every later Next repeats it). With
// BadSamples: Skip the loader logs the file and index, leaves the sample
// out and repeats another sample of the same batch in its place
// (Batch.Substituted), so epoch length, batch sizes and rank balance stay
// intact.
//
// When Next has waited Watchdog for a batch, the loader logs which stage
// holds it up (waiting for the memory budget, reading which files,
// transforming) and, with FailOnStall, returns ErrStalled.
//
// Stats reports samples/s, bytes/s, time to first batch, the time the
// consumer waited in Next, the time spent reading and transforming, memory
// held and its peak, skipped samples and watchdog reports; Collector
// exposes them as Prometheus metrics.
//
// Close cancels the pipeline, waits for every goroutine it started and
// closes the files it opened; it may be called at any time, also while
// Next waits in another goroutine (Next then returns ErrClosed).
//
// # Concurrency
//
// Next is called from one goroutine at a time. State, Stats, SetEpoch,
// Restore and Close may be called from any goroutine. A Batch belongs to
// its consumer.
package loader
