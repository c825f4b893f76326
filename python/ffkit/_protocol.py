"""The engine protocol, GENERATED from internal/engine/schema.go: do not edit.

Regenerate with `go run ./cmd/ffkit engine --schema python/ffkit/_protocol.py`
(TestPythonSchemaUpToDate in internal/engine fails when this file is stale).
Each request class is the header of one operation as a dict; the engine
refuses fields it does not define.
"""

VERSION = 4
# A frame's body-length word STREAM_MARK announces a streamed body: a u64
# total, then chunks of u32 length + bytes, each at most MAX_CHUNK bytes.
MAX_CHUNK = 16777216
STREAM_MARK = 0xFFFFFFFF
MAX_FDS = 4

# The int64s that open a batch reply's body, in order; then n sample
# indices and n [start, end) pairs of positions in the slot.
BATCH_FIELDS = ("slot", "lend", "n", "epoch", "step", "padded", "state_epoch", "state_cursor", "state_step", "grid",)
BATCH_META = len(BATCH_FIELDS)

# Every error code: code -> (kind, meaning).
ERROR_CODES = {
    "checksum": ("data", "a sample's CRC-32 does not match"),
    "truncated": ("data", "a file ends before its header or samples say"),
    "short_read": ("data", "a file is shorter than a read needs"),
    "corrupt": ("data", "a header or offset table is inconsistent"),
    "index": ("usage", "a sample index is out of range"),
    "no_files": ("usage", "a path names no .ffr files"),
    "state": ("usage", "a loader state does not fit this loader or dataset"),
    "options": ("usage", "loader options out of range"),
    "budget": ("usage", "a memory budget too small for one batch"),
    "bad_request": ("usage", "an unknown operation, handle or request field, or bad arguments"),
    "protocol": ("usage", "a frame that does not follow the protocol"),
    "canceled": ("other", "the request was canceled (Python closed its connection)"),
    "not_found": ("unavailable", "a file does not exist"),
    "permission": ("unavailable", "permission denied"),
    "no_space": ("unavailable", "no space left on the device"),
}


class HelloRequest(dict):
    """Checks the protocol version; names the engine's pid."""

    OP = "hello"
    FIELDS = ()
    REPLY_FIELDS = ("ok", "version", "pid",)
    STREAM_BODY = False

    def __init__(self):
        super().__init__(op="hello")


class CloseRequest(dict):
    """Closes a handle (closing twice is harmless)."""

    OP = "close"
    FIELDS = ("handle",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self, *, handle=0):
        super().__init__({"op": "close", "handle": int(handle)})


class ConnectRequest(dict):
    """Adds a request connection: one end of a socket pair, as the only descriptor."""

    OP = "connect"
    FIELDS = ()
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self):
        super().__init__(op="connect")


class FfrOpenRequest(dict):
    """Opens a reader of .ffr files and directories."""

    OP = "ffr_open"
    FIELDS = ("paths", "check_data", "direct",)
    REPLY_FIELDS = ("ok", "handle", "n", "files",)
    STREAM_BODY = False

    def __init__(self, *, paths=None, check_data=False, direct=False):
        super().__init__({"op": "ffr_open", "paths": None if paths is None else list(paths), "check_data": bool(check_data), "direct": bool(direct)})


class FfrReadRequest(dict):
    """Reads samples into a fresh shared-memory segment.

    Body: int64 sample indices.

    Reply body: 2 int64 per sample: [start, end) in the segment; descriptor: the segment (none when size is 0)."""

    OP = "ffr_read"
    FIELDS = ("handle",)
    REPLY_FIELDS = ("ok", "size",)
    STREAM_BODY = False

    def __init__(self, *, handle=0):
        super().__init__({"op": "ffr_read", "handle": int(handle)})


class FfrValidateRequest(dict):
    """Reads every sample with checksums on; lists bad ones (up to limit, default 100)."""

    OP = "ffr_validate"
    FIELDS = ("handle", "limit",)
    REPLY_FIELDS = ("ok", "n", "bad",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, limit=0):
        super().__init__({"op": "ffr_validate", "handle": int(handle), "limit": int(limit)})


class ReadRangesRequest(dict):
    """Reads raw byte ranges of files into a fresh shared-memory segment.

    Reply body: 2 int64 per range: [start, end) in the segment; descriptor: the segment (none when size is 0)."""

    OP = "read_ranges"
    FIELDS = ("ranges",)
    REPLY_FIELDS = ("ok", "size",)
    STREAM_BODY = False

    def __init__(self, *, ranges=None):
        super().__init__({"op": "read_ranges", "ranges": None if ranges is None else list(ranges)})


class FfwCreateRequest(dict):
    """Starts writing one .ffr file of n samples (published on ffw_close)."""

    OP = "ffw_create"
    FIELDS = ("path", "n",)
    REPLY_FIELDS = ("ok", "handle",)
    STREAM_BODY = False

    def __init__(self, *, path="", n=0):
        super().__init__({"op": "ffw_create", "path": path, "n": int(n)})


class FfwWriteRequest(dict):
    """Appends count samples.

    Body: count int64 lengths, then the samples' bytes end to end (streamed when long)."""

    OP = "ffw_write"
    FIELDS = ("handle", "count",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = True

    def __init__(self, *, handle=0, count=0):
        super().__init__({"op": "ffw_write", "handle": int(handle), "count": int(count)})


class FfwCloseRequest(dict):
    """Writes the header and publishes the file by rename."""

    OP = "ffw_close"
    FIELDS = ("handle",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self, *, handle=0):
        super().__init__({"op": "ffw_close", "handle": int(handle)})


class FfwAbortRequest(dict):
    """Abandons the file: nothing appears under its name."""

    OP = "ffw_abort"
    FIELDS = ("handle",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self, *, handle=0):
        super().__init__({"op": "ffw_abort", "handle": int(handle)})


class LoaderOpenRequest(dict):
    """Opens a loader whose batches go to a shared ring.

    Reply body: descriptor: the ring (see doc.go)."""

    OP = "loader_open"
    FIELDS = ("paths", "batch_size", "shuffle", "seed", "rank", "world_size", "drop_last", "prefetch", "hold", "ahead", "check_data", "direct", "workers", "memory_budget", "start_epoch", "skip_bad", "block_size",)
    REPLY_FIELDS = ("ok", "handle", "n", "slots", "slot_size", "board", "waiting_word", "wake_word", "batches_per_epoch", "items", "state",)
    STREAM_BODY = False

    def __init__(self, *, paths=None, batch_size=0, shuffle=False, seed=0, rank=0, world_size=0, drop_last=False, prefetch=0, hold=0, ahead=0, check_data=False, direct="", workers=0, memory_budget=0, start_epoch=0, skip_bad=False, block_size=0):
        super().__init__({"op": "loader_open", "paths": None if paths is None else list(paths), "batch_size": int(batch_size), "shuffle": bool(shuffle), "seed": int(seed), "rank": int(rank), "world_size": int(world_size), "drop_last": bool(drop_last), "prefetch": int(prefetch), "hold": int(hold), "ahead": int(ahead), "check_data": bool(check_data), "direct": direct, "workers": int(workers), "memory_budget": int(memory_budget), "start_epoch": int(start_epoch), "skip_bad": bool(skip_bad), "block_size": int(block_size)})


class LoaderNextRequest(dict):
    """Returns the next batch (a batch reply), or end.

    Reply body: a batch reply body (BatchFields)."""

    OP = "loader_next"
    FIELDS = ("handle", "release",)
    REPLY_FIELDS = ("ok", "end",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, release=None):
        super().__init__({"op": "loader_next", "handle": int(handle), "release": None if release is None else list(release)})


class LoaderStreamRequest(dict):
    """Turns the connection into a stream of batch replies.

    Reply body: one batch reply per batch (BatchFields)."""

    OP = "loader_stream"
    FIELDS = ("handle", "release", "stream",)
    REPLY_FIELDS = ("ok", "end",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, release=None, stream=0):
        super().__init__({"op": "loader_stream", "handle": int(handle), "release": None if release is None else list(release), "stream": int(stream)})


class LoaderReleaseRequest(dict):
    """Gives back the slots in release."""

    OP = "loader_release"
    FIELDS = ("handle", "release",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, release=None):
        super().__init__({"op": "loader_release", "handle": int(handle), "release": None if release is None else list(release)})


class LoaderReclaimRequest(dict):
    """After a stream stopped: gives back every lent slot not in keep."""

    OP = "loader_reclaim"
    FIELDS = ("handle", "keep", "stream",)
    REPLY_FIELDS = ("ok",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, keep=None, stream=0):
        super().__init__({"op": "loader_reclaim", "handle": int(handle), "keep": None if keep is None else list(keep), "stream": int(stream)})


class LoaderSetEpochRequest(dict):
    """Starts the given epoch."""

    OP = "loader_set_epoch"
    FIELDS = ("handle", "epoch",)
    REPLY_FIELDS = ("ok", "state",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, epoch=0):
        super().__init__({"op": "loader_set_epoch", "handle": int(handle), "epoch": int(epoch)})


class LoaderRestoreRequest(dict):
    """Resumes from a state."""

    OP = "loader_restore"
    FIELDS = ("handle", "state",)
    REPLY_FIELDS = ("ok", "state",)
    STREAM_BODY = False

    def __init__(self, *, handle=0, state=None):
        super().__init__({"op": "loader_restore", "handle": int(handle), "state": state})


class LoaderStatsRequest(dict):
    """Returns the loader's stage statistics."""

    OP = "loader_stats"
    FIELDS = ("handle",)
    REPLY_FIELDS = ("ok", "stats",)
    STREAM_BODY = False

    def __init__(self, *, handle=0):
        super().__init__({"op": "loader_stats", "handle": int(handle)})


class ScanRequest(dict):
    """Runs a scan job into an Arrow IPC file in shared memory.

    Reply body: descriptor: the Arrow IPC file (size bytes)."""

    OP = "scan"
    FIELDS = ("inputs", "columns", "where", "sql", "group_by", "aggs", "workers",)
    REPLY_FIELDS = ("ok", "size", "summary",)
    STREAM_BODY = False

    def __init__(self, *, inputs=None, columns="", where="", sql="", group_by=None, aggs="", workers=0):
        super().__init__({"op": "scan", "inputs": None if inputs is None else list(inputs), "columns": columns, "where": where, "sql": sql, "group_by": None if group_by is None else list(group_by), "aggs": aggs, "workers": int(workers)})


REQUESTS = {c.OP: c for c in (HelloRequest, CloseRequest, ConnectRequest, FfrOpenRequest, FfrReadRequest, FfrValidateRequest, ReadRangesRequest, FfwCreateRequest, FfwWriteRequest, FfwCloseRequest, FfwAbortRequest, LoaderOpenRequest, LoaderNextRequest, LoaderStreamRequest, LoaderReleaseRequest, LoaderReclaimRequest, LoaderSetEpochRequest, LoaderRestoreRequest, LoaderStatsRequest, ScanRequest)}
