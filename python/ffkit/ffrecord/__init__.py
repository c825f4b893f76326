"""A drop-in for HFAiLab's ``ffrecord`` package, served by ffkit's Go engine.

Change ``import ffrecord`` to ``import ffkit.ffrecord as ffrecord`` (or
``from ffkit.ffrecord import FileReader, FileWriter``). The files are
byte-compatible with the reference. Differences, all on purpose:

- ``read`` takes any number of indices (no 4096 limit) and returns 1-D
  ``uint8`` numpy arrays that view shared memory the engine filled (no copy);
  each array stays valid as long as you hold it (nothing reuses its memory).
- Readers work in forked DataLoader workers whatever the parent did, pickle
  to spawned workers, and are safe to share between threads.
- ``write_one`` stores the bytes of any buffer (bytes, bytearray, memoryview,
  a numpy array of any dtype and shape), not ``shape[0]`` of them.
- Empty files and empty samples work; bad data raises
  ``ffkit.errors.ChecksumError`` / ``TruncatedError`` / ``CorruptError``
  (all ``ValueError``) naming the file, sample and bytes; nothing aborts the
  process and no read is ever silently short.
"""
import fcntl
import os
import struct

import numpy as np

from .. import __version__, _engine, _protocol, errors

__all__ = ["FileReader", "FileWriter", "PackedFolder", "pack_folder", "checkFsAlign", "__version__"]

# The reference's ioctl that asks HFAI's file system whether a descriptor's
# reads are aligned (see checkFsAlign).
_FS_IOCNUM_CHECK_FS_ALIGN = 2147772004


def checkFsAlign(fd):
    """True when the file system of ``fd`` says (through the reference's
    FS_IOCNUM_CHECK_FS_ALIGN ioctl, HFAI's 3FS) that direct reads of it are
    aligned; False on every other file system. Same answer as the
    reference's ``ffrecord.checkFsAlign``."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(int(fd), _FS_IOCNUM_CHECK_FS_ALIGN, buf)
    except OSError:
        return False
    return struct.unpack("i", buf)[0] == 1


def _paths(fname):
    if isinstance(fname, (str, bytes, os.PathLike)):
        return [os.fsdecode(os.fspath(fname))]
    if isinstance(fname, (list, tuple)):
        if not fname:
            raise errors.UsageError("ffrecord: empty list of files")
        return [os.fsdecode(os.fspath(f)) for f in fname]
    raise TypeError(f"fname must be a str, os.PathLike or a list of them, not {type(fname).__name__}")


def _indices(indices):
    if isinstance(indices, np.ndarray):
        idx = indices
    else:
        if not isinstance(indices, (list, tuple, range)):
            indices = list(indices)
        idx = np.asarray(indices) if len(indices) else np.empty(0, dtype=np.int64)
    if idx.ndim != 1:
        raise TypeError(f"indices must be a 1-D sequence of ints, got shape {idx.shape}")
    if idx.size and idx.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {idx.dtype}")
    return np.ascontiguousarray(idx, dtype="<i8")


class FileReader(_engine.Handle):
    """Reads samples of one .ffr file, a directory of them, or a list of both.

    Args:
        fname: a file, a directory of ``*.ffr`` files (sorted by name), or a
            list of files and directories, concatenated into one dataset.
        check_data: verify each sample's CRC-32 when it is read (default True).

    Attributes:
        n: number of samples.
    """

    def __init__(self, fname, check_data=True):
        super().__init__()
        self.fnames = _paths(fname)
        self.check_data = bool(check_data)
        self._open_header = _protocol.FfrOpenRequest(paths=self.fnames, check_data=self.check_data)
        self.n = None
        self._ensure()

    def _opened(self, rep):
        n = rep.header["n"]
        if self.n is not None and n != self.n:
            raise errors.DataError(f"ffrecord: {self.fnames} changed: it had {self.n} samples, now {n}")
        self.n = n
        self.files = rep.header.get("files") or []

    def __len__(self):
        return self.n

    def read(self, indices):
        """Reads a batch of samples in the order given (duplicates allowed).

        Returns a list of 1-D uint8 numpy arrays, one per index, viewing
        shared memory the engine filled; they stay valid while referenced.
        """
        idx = _indices(indices)
        rep = self._call(_protocol.FfrReadRequest(), memoryview(idx).cast("B"))
        return _engine.split(rep)

    def read_one(self, index):
        """Reads one sample as a 1-D uint8 numpy array."""
        return self.read([int(index)])[0]

    def validate(self):
        """Reads every sample with checksums on (whatever check_data says).
        Raises a DataError naming every bad sample (up to 100); returns None
        when all samples are good."""
        rep = self._call(_protocol.FfrValidateRequest())
        bad = rep.header.get("bad") or []
        if bad:
            first = bad[0]
            cls = errors.from_reply({"error": "", "kind": "data", "code": first.get("code")}).__class__
            if not issubclass(cls, errors.DataError):
                cls = errors.DataError
            lines = "\n  ".join(b["error"] for b in bad)
            e = cls(f"ffrecord: {len(bad)} bad sample(s) in {self.fnames}:\n  {lines}")
            e.bad = bad
            raise e

    def close(self):
        if not self._closed:
            self._close_handle()
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        return {"fnames": self.fnames, "check_data": self.check_data, "n": self.n}

    def __setstate__(self, state):
        _engine.Handle.__init__(self)
        self.fnames = state["fnames"]
        self.check_data = state["check_data"]
        self.n = state["n"]
        self.files = []
        self._open_header = _protocol.FfrOpenRequest(paths=self.fnames, check_data=self.check_data)
        # Opened lazily, in whichever process uses it.

    def __repr__(self):
        return f"FileReader({self.fnames!r}, n={self.n}, check_data={self.check_data})"


def _as_bytes_view(data):
    """The bytes of any buffer, as a flat memoryview (no copy when contiguous;
    a non-contiguous buffer is copied once)."""
    if isinstance(data, str):
        raise TypeError("write_one needs bytes or a buffer, not str (encode it first)")
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return memoryview(data.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"write_one needs bytes or a buffer, not {type(data).__name__}") from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.format == "B" and mv.ndim == 1:
        return mv
    return mv.cast("B") if mv.nbytes else memoryview(b"")


class FileWriter(_engine.Handle):
    """Writes one .ffr file of exactly n samples (byte-compatible with the
    reference). Nothing appears under ``fname`` until ``close`` succeeds; a
    writer left by an exception (``with`` block) leaves no file.

    Memory: small samples are gathered (copied once) into a buffer of at
    most 8 MiB that goes to the engine in one request; a sample of 1 MiB or
    more is sent straight from the caller's buffer (numpy arrays, bytes,
    memoryviews, any buffer) without any copy, streamed in 16 MiB chunks
    whatever its size, before ``write_one`` returns.
    """

    _FLUSH_BYTES = 8 << 20
    _FLUSH_COUNT = 4096
    _DIRECT_BYTES = 1 << 20

    def __init__(self, fname, n):
        super().__init__()
        if not isinstance(fname, (str, os.PathLike)):
            raise TypeError("fname must be str or os.PathLike")
        n = int(n)
        if n < 0:
            raise errors.UsageError(f"ffrecord: n must be >= 0, got {n}")
        self.fname = os.fspath(fname)
        self.n = n
        self.count = 0
        self._open_header = _protocol.FfwCreateRequest(path=self.fname, n=n)
        self._buf = bytearray()  # pending small samples, end to end
        self._lens = []  # their lengths
        self._pid = os.getpid()
        self._ensure()

    def _ensure(self):
        if self._eng is not None and self._pid != os.getpid():
            raise errors.UsageError("ffrecord: a FileWriter cannot be used in a forked child")
        if self._eng is not None and self._eng.dead:
            raise errors.EngineError("ffrecord: the engine writing this file died; the file was not written")
        return super()._ensure()

    def write_one(self, data):
        """Appends one sample: the bytes of ``data`` (bytes-like or numpy array)."""
        if self._closed:
            raise ValueError("FileWriter is closed")
        if self.count >= self.n:
            raise errors.UsageError(f"ffrecord: {self.fname}: already wrote all {self.n} samples")
        mv = _as_bytes_view(data)
        if mv.nbytes >= self._DIRECT_BYTES:
            self._flush()
            self._send([mv.nbytes], [mv])
            self.count += 1
            return
        self._buf += mv
        self._lens.append(mv.nbytes)
        self.count += 1
        if len(self._buf) >= self._FLUSH_BYTES or len(self._lens) >= self._FLUSH_COUNT:
            self._flush()

    def _send(self, lens, parts):
        lens = np.asarray(lens, dtype="<i8")
        self._call(_protocol.FfwWriteRequest(count=len(lens)), [memoryview(lens).cast("B"), *parts])

    def _flush(self):
        if not self._lens:
            return
        lens, buf = self._lens, self._buf
        self._lens, self._buf = [], bytearray()
        self._send(lens, [buf])

    def close(self):
        """Writes the header and publishes the file. Raises if fewer than n
        samples were written (and then leaves no file)."""
        if self._closed:
            return
        try:
            if self.count != self.n:
                raise errors.UsageError(
                    f"ffrecord: {self.fname}: wrote {self.count} of {self.n} samples; the file was not written"
                )
            self._flush()
            self._call(_protocol.FfwCloseRequest())
            self._eng = self._hid = None
        except BaseException:
            self.abort()
            raise
        finally:
            self._closed = True

    def abort(self):
        """Abandons the file: nothing is left under its name."""
        self._lens, self._buf = [], bytearray()
        if self._eng is not None:
            e, hid = self._eng, self._hid
            self._eng = self._hid = None
            if not e.dead and e.pid == os.getpid():
                try:
                    e.call(_protocol.FfwAbortRequest(handle=hid))
                except Exception:
                    pass
        self._closed = True

    finish = close

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        try:
            if not self._closed and self._pid == os.getpid():
                if self.count == self.n:
                    self.close()
                else:
                    self.abort()
        except Exception:
            pass

    def __getstate__(self):
        raise TypeError("a FileWriter cannot be pickled")


from .package import PackedFolder, pack_folder  # noqa: E402
