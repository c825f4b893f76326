// Package bench is the one measurement core that every ffkit benchmark uses
// (bench read, bench fs, bench sweep, bench checkpoint, bench model-load,
// bench parallel-write). It exists so that every figure ffkit prints is
// measured the same honest way:
//
//   - Time comes from a Clock. Wall is the real monotonic clock; a
//     ManualClock is advanced by the code under test (see ThrottledFS), so
//     the core's arithmetic is tested without wall-clock assertions.
//   - Run executes an operation on a number of workers for a duration or a
//     count. Warm-up operations run first and are excluded from every figure.
//     Each measured operation's latency is recorded (Latency: p50/p90/p99/max),
//     and throughput is ops/s, bytes/s and MiB/s.
//   - With several workers the aggregate rate is total bytes over the span
//     from the first worker's start to the last worker's end (Aggregate); the
//     naive sum of per-worker rates is reported next to it, never instead.
//   - Repeat runs a measurement several times and reports the spread
//     (min/mean/max/stddev) so that one lucky run is not the headline.
//   - Compare puts our figure next to a baseline measured in the same run
//     (a plain pread loop, fio on the same file) with the ratio ours/baseline.
//   - Table prints aligned human tables; WriteJSON prints the JSON document
//     (with the CLI's --json it is the only thing on stdout).
//   - RunFio runs fio (when installed) with --output-format=json and parses
//     bandwidth, IOPS and completion-latency percentiles, so a benchmark can
//     print fio's figure for the same row beside ours.
//   - DropCaches / EvictFile make reads cold when O_DIRECT
//     (fs.OpenOptions{Direct: true}) is not used.
//   - IOConfig is the small JSON file `ffkit bench sweep` writes with the best
//     configuration and `ffkit load --io-config FILE` reads.
//   - Report renders a self-contained HTML page with inline SVG charts.
//   - Workdir is a benchmark's directory on any fs.FS (resolved with
//     fs.Resolve, so local paths and ffkit:// URLs alike): it creates it,
//     tracks the files the benchmark makes and removes them (and the
//     directories it created) afterwards; files that were there are never
//     touched. Pattern gives incompressible, non-repeating data to write.
//   - ThrottledFS wraps an fs.FS so every read and write costs time on a
//     Clock at a configured rate: the fault-injection style wrapper the
//     core's own tests (and any benchmark's) run against.
//
// Concurrency: Run, Repeat and RunFio may be called from any goroutine; a
// Recorder, a ManualClock, a ThrottledFS and a Workdir are safe for
// concurrent use; Table and Report belong to one goroutine. Run calls an
// Op from one goroutine per worker, so per-worker state indexed by the
// worker number needs no lock.
//
// Ownership: Result.Spans and the slices in a Repeated belong to the
// caller; Pattern.Chunk returns a slice shared with the pattern, valid
// until the next call.
package bench
