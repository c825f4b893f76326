"""Packing sources into FFRecord (``ffkit.pack``) and the WebDataset container.

``pack`` runs the bundled ``ffkit pack`` (the Go library ``pack``), so it
reads every source the CLI reads, local or ``ffkit://``, and publishes a
directory dataset in one atomic step. See docs/pack.md.
"""
import json
import os
import struct
import subprocess
import threading

from . import errors

_MAGIC = b"FFWD"
_HEAD = struct.Struct("<4sII")
_EXT_LEN = struct.Struct("<H")
_SIZE = struct.Struct("<Q")


def decode_webdataset(sample):
    """Splits one sample packed with ``--format webdataset`` into a dict
    ``{extension: memoryview}``, e.g. ``{"jpg": ..., "json": ...}``.

    The values are views into ``sample`` (no copy): keep ``sample`` alive
    while using them (``bytes(v)`` copies one out). Raises DataError when
    the bytes are not such a container.
    """
    mv = memoryview(sample).cast("B")
    if len(mv) < _HEAD.size:
        raise errors.DataError("ffkit: not a WebDataset container (too short)")
    magic, version, count = _HEAD.unpack_from(mv, 0)
    if magic != _MAGIC:
        raise errors.DataError("ffkit: not a WebDataset container (no FFWD magic)")
    if version != 1:
        raise errors.DataError(f"ffkit: WebDataset container version {version} is not supported")
    pos = _HEAD.size
    entries = []
    for i in range(count):
        if pos + 2 > len(mv):
            raise errors.DataError(f"ffkit: WebDataset container header cut short at entry {i}")
        (n,) = _EXT_LEN.unpack_from(mv, pos)
        pos += 2
        if pos + n + 8 > len(mv):
            raise errors.DataError(f"ffkit: WebDataset container header cut short at entry {i}")
        ext = bytes(mv[pos : pos + n]).decode("utf-8")
        (size,) = _SIZE.unpack_from(mv, pos + n)
        pos += n + 8
        entries.append((ext, size))
    out = {}
    for ext, size in entries:
        if size > len(mv) - pos:
            raise errors.DataError(f"ffkit: WebDataset member {ext!r} of {size} bytes runs past the end")
        out[ext] = mv[pos : pos + size]
        pos += size
    if pos != len(mv):
        raise errors.DataError(f"ffkit: {len(mv) - pos} bytes after the last WebDataset member")
    return out


def pack(src, out, *, format="auto", column=None, shard_size=None, align=None, workers=None,
         index_format="jsonl", force=False, progress=None):
    """Packs ``src`` into the FFRecord dataset ``out`` and returns the result
    dict (``samples``, ``files``, ``bytes``, ``data_bytes``, ``index``,
    ``format``, ``seconds``, ``mib_s``).

    src: a directory, JSON Lines, tar / tar.gz, WebDataset shards
    (``format="webdataset"``), Parquet or Arrow; a local path or ``ffkit://``.
    out: ``*.ffr`` for one file, anything else for a directory of shards.
    column: the Parquet/Arrow column whose bytes are the samples (default:
    each row as a JSON object). shard_size: bytes or a string such as
    ``"256M"``. progress: called as ``progress(samples, bytes)`` now and
    then, and once at the end. Raises FFKitError (DataError for bad source
    bytes) with the CLI's message.
    """
    from ._engine import binary_path

    args = [binary_path(), "--json", "pack", os.fspath(src), "-o", os.fspath(out),
            "--format", format, "--index-format", index_format]
    if column is not None:
        args += ["--column", column]
    if shard_size is not None:
        args += ["--shard-size", str(shard_size)]
    if align is not None:
        args += ["--align", str(int(align))]
    if workers is not None:
        args += ["--workers", str(int(workers))]
    if force:
        args.append("--force")
    if progress is not None:
        args.append("--progress-lines")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    messages = []
    try:
        for line in proc.stderr:
            text = line.decode("utf-8", "replace").rstrip("\n")
            parts = text.split()
            if len(parts) == 3 and parts[0] == "progress" and parts[1].isdigit() and parts[2].isdigit():
                if progress is not None:
                    progress(int(parts[1]), int(parts[2]))
                continue
            messages.append(text)
        code = proc.wait()
    except BaseException:
        proc.kill()  # e.g. KeyboardInterrupt: nothing is published
        proc.wait()
        raise
    finally:
        reader.join()
    if code != 0:
        msg = "\n".join(m for m in messages if m) or f"ffkit pack exited {code}"
        cls = {1: errors.DataError, 2: errors.UsageError, 3: errors.UnavailableError}.get(code, errors.FFKitError)
        raise cls(msg)
    return json.loads(stdout[0])
