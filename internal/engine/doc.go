// Package engine is the Go I/O engine that serves the Python package ffkit.
//
// The Go runtime does not survive fork(), and PyTorch forks its DataLoader
// workers, so Go never runs inside a Python process. Instead Python starts
// `ffkit engine` (a hidden subcommand of the bundled binary) as a helper
// process and talks to it over Unix stream sockets. Sample bytes never cross
// the socket: the engine writes them into shared memory (memfd segments whose
// descriptors it passes with SCM_RIGHTS), and numpy views that memory without
// copying. A Python process that finds itself forked starts its own helper.
//
// # Schema
//
// Every operation, its request and reply header fields, the error codes and
// the batch-body layout are defined once, in schema.go. The server decodes
// each request into its operation's own type and refuses a field that type
// does not define, naming it; python/ffkit/_protocol.py is generated from
// the schema (`ffkit engine --schema FILE`, checked by a test), and golden
// frames in testdata/frames are read by the Go and the Python tests alike.
//
// # Connections
//
// The helper is started with one socket, the control connection, on a file
// descriptor named by --fd, and with --parent naming the Python process.
// The helper lives as long as the control connection and its parent: when
// Python closes the connection or dies (PR_SET_PDEATHSIG, and a parent
// check four times a second, in case a forked child still holds the
// socket), or on SIGTERM or SIGINT, the helper closes every handle (an
// unfinished writer publishes nothing) and exits. Its stdio is /dev/null. Python adds
// request connections by sending one end of a new socket pair in a "connect"
// request; each connection is served by its own goroutine, so several Python
// threads can have requests in flight at once. Handles (open readers,
// writers, loaders) belong to the helper, not to a connection, and may be
// used from any connection. Closing a request connection while a request is
// running cancels that request (this is how Ctrl-C in Python interrupts a
// long read).
//
// # Frames
//
// Every request and every response is one frame:
//
//	+----------------+----------------+-----------------+------------------+
//	| u32 header len | u32 body len   | header (JSON)   | body (raw bytes) |
//	+----------------+----------------+-----------------+------------------+
//	  little-endian    little-endian
//
// The header of a request names the operation ({"op": "ffr_read", ...}); the
// body carries bulk arguments (int64 sample indices, bytes to write). A
// response header is {"ok": true, ...} or {"error": "message", "kind":
// "data"|"usage"|"unavailable"|"other", "code": "checksum"|...}; its body
// carries bulk results (int64 offsets into shared memory). File descriptors
// travel as SCM_RIGHTS ancillary data on the frame's first bytes.
//
// A body longer than MaxChunk (16 MiB) is streamed: the body length word is
// 0xFFFFFFFF and the header is followed by
//
//	+----------------+---------------+-------------+---------------+-----+
//	| u64 total len  | u32 chunk len | chunk bytes | u32 chunk len | ... |
//	+----------------+---------------+-------------+---------------+-----+
//
// with chunks of 1..MaxChunk bytes adding up to the total, so no size is
// capped by the frame format. ffw_write copies a streamed sample from the
// socket into the file chunk by chunk (the engine holds one chunk, whatever
// the sample's size; Python sends it straight from the caller's buffer);
// other operations receive their streamed body whole.
//
// # Shared memory ownership
//
// A one-shot segment (ffr_read) is a fresh memfd per response: the engine
// fills it, unmaps it and closes its descriptor after sending it, so the
// memory belongs to Python alone and lives as long as Python maps it; nothing
// ever reuses it, which keeps arrays valid in forked children too.
//
// A loader's ring is one memfd mapped once by both sides, laid out as
//
//	+-------------------------------------------+-----------+-----------+-----+
//	| release board (4 KiB): u32 per slot,      | slot 0    | slot 1    | ... |
//	| ..., u32 waiting (word 1022), u32 wake    | slot size | slot size |     |
//	| (word 1023); all little-endian            |           |           |     |
//	+-------------------------------------------+-----------+-----------+-----+
//
// The Go loader reads each batch straight into a free slot (a ringArena
// over the ring). "loader_stream" turns its connection into a one-way
// stream: the engine writes one reply frame per batch as soon as it is
// ready. A batch reply (of loader_stream and loader_next) has the constant
// header {"batch":true,"ok":true} and a binary body of little-endian int64s:
// slot, lend number, n, epoch, step, padded, the state after the batch
// (epoch, cursor, step), the grid (L when every sample is L > 0 bytes at a
// multiple of L in the slot, else 0), the n sample indices, and each
// sample's [start, end) in the slot; so no JSON is encoded or decoded per
// batch. The slot is
// lent to Python until Python writes the lend number into the slot's board
// word (no request). The engine reads the board before each batch and
// whenever the loader needs a slot and none is free. Finding none, it
// writes into the waiting word the lend number W of the k-th oldest lent
// batch (k = min(prefetch, half the lent batches)), reads the board once
// more and sleeps on the wake word (a futex, FUTEX_WAIT on shared memory). Python's release of a batch lent as W or
// later (wrapping uint32 order) adds one to the wake word and wakes it
// (FUTEX_WAKE, the system call through ctypes); so does Python when it is
// about to wait on an empty stream while the waiting word is set (it holds
// more than hold batches). So the producer wakes once per several batches,
// and then refills every released slot. The sleep is bounded (2 ms) so that
// a wake-up lost to the unfenced store on the Python side costs at most
// that; nothing depends on the other process staying alive. The open reply
// names both words ("waiting_word", "wake_word": word indices on the
// board).
//
// The ring has room for every batch the Go loader plans ahead (2*prefetch
// + 2), those sent ahead into the socket ("ahead") and those Python holds
// ("hold"), so the engine waits for Python only when Python holds more
// than hold batches (a memory budget too small for that takes planned
// slots off first). Python stops a stream by closing its connection, then
// sends "loader_reclaim" with the slots it still holds: every other lent
// slot comes back (batches that were in the socket), after the stream has
// stopped. Streams are numbered ("stream": 1, 2, ...) and a reclaim names
// the last one opened: a stream request the engine reads only after that
// reclaim (it sat unread in the closed connection) is refused, so it cannot
// take a batch from the rewound loader and lose it.
//
// Concurrency: Server is safe for concurrent connections; each handle
// serialises its own state with a mutex.
package engine
