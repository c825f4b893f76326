"""The channel to ffkit's Go I/O engine.

The Go runtime does not survive fork(), and PyTorch forks DataLoader workers,
so Go never runs inside Python. Each Python process starts the bundled binary
(``ffkit/_bin/ffkit engine``) as a helper process the first time it needs it
and talks to it over Unix sockets; sample bytes land in shared memory (memfd)
that numpy views without copying. A process that finds itself forked (its pid
changed) drops the channel it inherited and starts its own helper; objects
that hold engine handles (readers, loaders) reopen them there transparently.

Threads: each request takes an idle connection from a pool (opening a new one
if none is idle), so threads do not wait for each other and the GIL is
released while a request blocks in the socket.

Ctrl-C: a KeyboardInterrupt raised while a request waits closes that
request's connection; the engine sees the close and cancels the request.

Lifecycle: the helper's stdin, stdout and stderr are /dev/null (set
FFKIT_ENGINE_LOG=FILE to append its stderr to FILE), so it never holds a
pipe of this process open; it exits when this process exits or dies, even
killed with SIGKILL (it is told this process's pid and watches it), and on
SIGTERM/SIGINT. A request that finds the helper gone starts a fresh one.

Frames and request headers follow ``_protocol`` (generated from the engine's
schema): bodies longer than ``MAX_CHUNK`` are streamed in chunks, sent
straight from the caller's buffers.
"""
import atexit
import ctypes
import functools
import json
import mmap
import os
import platform
import socket
import struct
import subprocess
import threading

import numpy as np

from . import _protocol, errors

PROTOCOL_VERSION = _protocol.VERSION
_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ffkit")
_PRE = struct.Struct("<II")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAX_FDS = _protocol.MAX_FDS
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def binary_path():
    """The bundled engine binary (never looked up on PATH)."""
    if not os.path.isfile(_BIN):
        raise errors.EngineError(
            f"ffkit: the bundled engine binary is missing ({_BIN}); "
            "reinstall the package with `pip install ./python` from an ffkit checkout"
        )
    if not os.access(_BIN, os.X_OK):
        try:
            os.chmod(_BIN, 0o755)
        except OSError as e:
            raise errors.EngineError(f"ffkit: the engine binary {_BIN} is not executable: {e}") from None
    return _BIN


class Reply:
    __slots__ = ("header", "body", "fds")

    def __init__(self, header, body, fds):
        self.header = header
        self.body = body
        self.fds = fds

    def close_fds(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _recv_exact_into(sock, view):
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise errors.EngineError("ffkit: the engine closed the connection mid-reply")
        got += k


def _nbytes(part):
    return part.nbytes if isinstance(part, memoryview) else len(part)


def frame_prefix(header, body_len, max_chunk=None):
    """The bytes that open a request frame: lengths, then the JSON header
    (and a streamed body's total when body_len exceeds the chunk size)."""
    max_chunk = max_chunk or _protocol.MAX_CHUNK
    h = json.dumps(header, separators=(",", ":")).encode()
    if body_len > max_chunk:
        return _PRE.pack(len(h), _protocol.STREAM_MARK) + h + _U64.pack(body_len)
    return _PRE.pack(len(h), body_len) + h


def encode_request(header, parts=(), max_chunk=None):
    """A whole request frame as bytes (for tests and golden frames)."""
    out = bytearray()
    for piece in _frame_pieces(header, [memoryview(p).cast("B") for p in parts], max_chunk):
        out += piece
    return bytes(out)


def _frame_pieces(header, parts, max_chunk=None):
    """The frame as a list of buffers, views of the caller's parts (no copy
    of the body)."""
    max_chunk = max_chunk or _protocol.MAX_CHUNK
    total = sum(_nbytes(p) for p in parts)
    pieces = [frame_prefix(header, total, max_chunk)]
    if total <= max_chunk:
        pieces += [p for p in parts if _nbytes(p)]
        return pieces
    # Streamed: chunks of at most max_chunk bytes, each after its length,
    # cut from the parts without copying.
    chunk, room = [], max_chunk
    for p in parts:
        mv = p if isinstance(p, memoryview) else memoryview(p)
        while mv.nbytes:
            take = mv[:room]
            chunk.append(take)
            room -= take.nbytes
            mv = mv[take.nbytes:]
            if room == 0:
                pieces.append(_U32.pack(max_chunk))
                pieces += chunk
                chunk, room = [], max_chunk
    if chunk:
        pieces.append(_U32.pack(max_chunk - room))
        pieces += chunk
    return pieces


def send_request(sock, header, body=b"", fds=()):
    """Sends one request frame. ``body`` is a buffer or a list of buffers,
    sent as they are (no copy); bodies over MAX_CHUNK are streamed."""
    parts = body if isinstance(body, (list, tuple)) else [body]
    parts = [p if isinstance(p, memoryview) else memoryview(p) for p in parts]
    parts = [p if p.format == "B" and p.ndim == 1 else p.cast("B") for p in parts]
    pieces = _frame_pieces(header, parts)
    first = pieces[0]
    if len(pieces) > 1 and sum(_nbytes(p) for p in pieces) <= 65536:
        first = b"".join(pieces)  # a small frame: one system call
        pieces = [first]
    if fds:
        sent = socket.send_fds(sock, [first], list(fds))
        if sent < len(first):
            sock.sendall(first[sent:])
    else:
        sock.sendall(first)
    for p in pieces[1:]:
        sock.sendall(p)


def recv_reply(sock):
    """Receives one reply frame (raising its error as an exception)."""
    data, rfds, _, _ = socket.recv_fds(sock, 65536, _MAX_FDS)
    try:
        if not data:
            raise errors.EngineError("ffkit: the engine closed the connection (did the helper process die?)")
        if len(data) < 8:
            data += _recv_exact(sock, 8 - len(data))
        hl, bl = _PRE.unpack_from(data)
        if bl == _protocol.STREAM_MARK:
            return _recv_streamed(sock, data, hl, rfds)
        total = 8 + hl + bl
        if len(data) < total:
            buf = bytearray(total)
            buf[: len(data)] = data
            _recv_exact_into(sock, memoryview(buf)[len(data):])
            data = buf
        hdr = json.loads(bytes(data[8 : 8 + hl]))
        rbody = memoryview(data)[8 + hl : total]
    except BaseException:
        for fd in rfds:
            os.close(fd)
        raise
    rep = Reply(hdr, rbody, list(rfds))
    if "error" in hdr:
        rep.close_fds()
        raise errors.from_reply(hdr)
    return rep


def _recv_streamed(sock, data, hl, rfds):
    """The rest of a reply whose body is streamed (longer than MAX_CHUNK)."""
    need = 8 + hl + 8
    if len(data) < need:
        data = bytes(data) + _recv_exact(sock, need - len(data))
    hdr = json.loads(bytes(data[8 : 8 + hl]))
    (total,) = _U64.unpack_from(data, 8 + hl)
    body = bytearray(total)
    mv = memoryview(body)
    rest = memoryview(data)[need:]
    pos = 0
    pending = bytes(rest)
    while pos < total:
        while len(pending) < 4:
            pending += _recv_exact(sock, 4 - len(pending))
        (n,) = _U32.unpack_from(pending)
        if n == 0 or n > _protocol.MAX_CHUNK or n > total - pos:
            raise errors.EngineError(f"ffkit: bad streamed reply chunk of {n} bytes")
        pending = pending[4:]
        k = min(n, len(pending))
        mv[pos : pos + k] = pending[:k]
        pending = pending[k:]
        if k < n:
            _recv_exact_into(sock, mv[pos + k : pos + n])
        pos += n
    rep = Reply(hdr, mv, list(rfds))
    if "error" in hdr:
        rep.close_fds()
        raise errors.from_reply(hdr)
    return rep


_ANC = socket.CMSG_SPACE(_MAX_FDS * 4)
# The constant header of a batch reply (the batch is described in the binary
# body): recognised by its bytes, not parsed. BATCH is shared: never mutate.
_BATCH_HEADER = b'{"batch":true,"ok":true}'
BATCH = {"batch": True, "ok": True}
_BATCH_HEADER_LEN = len(_BATCH_HEADER)
_FD_SIZE = struct.calcsize("i")


class Pipe:
    """A connection with several requests in flight: replies arrive back to
    back, so bytes past one frame are kept for the next.

    Receives into one preallocated buffer (recvmsg_into): a fresh 256 KiB
    bytes object per recv cost more than everything else a streamed batch
    costs in Python."""

    def __init__(self, sock, size=1 << 18):
        self.sock = sock
        self._buf = bytearray(size)
        self._mv = memoryview(self._buf)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0
        self._fds = []
        # Called with the socket before receiving whenever no whole frame
        # is buffered (the caller may be about to wait for the peer).
        self.on_empty = None

    def send(self, header, body=b""):
        send_request(self.sock, header, body)

    def _fill(self, need):
        """Receives at least one more chunk, making room for a frame of
        `need` bytes starting at _start."""
        if self.on_empty is not None:
            self.on_empty(self.sock)
        buf = self._buf
        if self._start + need > len(buf):
            n = self._end - self._start
            if need > len(buf):
                nbuf = bytearray(max(need, 2 * len(buf)))
                nbuf[:n] = self._mv[self._start : self._end]
                self._mv.release()
                self._buf, self._mv = nbuf, memoryview(nbuf)
            else:
                buf[:n] = self._mv[self._start : self._end].tobytes()  # may overlap
            self._start, self._end = 0, n
        k, anc, _, _ = self.sock.recvmsg_into([self._mv[self._end :]], _ANC)
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                n = len(data) // _FD_SIZE
                self._fds += struct.unpack(f"{n}i", data[: n * _FD_SIZE])
        if not k:
            raise errors.EngineError("ffkit: the engine closed the connection (did the helper process die?)")
        self._end += k

    def recv(self):
        while True:
            avail = self._end - self._start
            if avail >= 8:
                s = self._start
                hl, bl = _PRE.unpack_from(self._buf, s)
                total = 8 + hl + bl
                if avail >= total:
                    if avail == total:
                        self._start = self._end = 0
                    else:
                        self._start = s + total
                    if hl == _BATCH_HEADER_LEN and self._buf.startswith(_BATCH_HEADER, s + 8):
                        # A batch: its body, int64s, copied out of the
                        # receive buffer in one step (an array the batch
                        # keeps: indices and positions are views of it).
                        return Reply(BATCH, np.frombuffer(self._buf, "<i8", bl >> 3, s + 8 + hl).copy(), ())
                    mv = self._mv
                    hdr = json.loads(mv[s + 8 : s + 8 + hl].tobytes())
                    body = mv[s + 8 + hl : s + total].tobytes()
                    rep = Reply(hdr, body, self._fds)
                    self._fds = []
                    if "error" in hdr:
                        rep.close_fds()
                        raise errors.from_reply(hdr)
                    return rep
                self._fill(total)
            else:
                self._fill(8)

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.sock.close()


def roundtrip(sock, header, body=b"", fds=()):
    """Sends one request frame and returns the reply (raising its error)."""
    send_request(sock, header, body, fds)
    return recv_reply(sock)


def _recv_exact(sock, n):
    buf = bytearray(n)
    _recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


class Engine:
    """One helper process and the connections to it, owned by one pid."""

    def __init__(self):
        self.pid = os.getpid()
        self.dead = False
        self._idle = []  # idle request connections (list ops are atomic)
        self._ctl_lock = threading.Lock()
        ctl, remote = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log = None
        try:
            log_path = os.environ.get("FFKIT_ENGINE_LOG")
            if log_path:
                log = open(log_path, "ab")
            self.proc = subprocess.Popen(
                [binary_path(), "engine", "--fd", str(remote.fileno()), "--parent", str(os.getpid())],
                pass_fds=(remote.fileno(),),
                stdin=subprocess.DEVNULL,
                # Never our stdout/stderr: a helper must not hold a
                # pipeline's pipe open.
                stdout=subprocess.DEVNULL,
                stderr=log if log is not None else subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C reaches Python only;
                # the helper ends when the control socket closes or this
                # process dies.
                start_new_session=True,
            )
        except BaseException:
            ctl.close()
            raise
        finally:
            remote.close()
            if log is not None:
                log.close()
        self._ctl = ctl
        try:
            with self._ctl_lock:
                rep = roundtrip(ctl, _protocol.HelloRequest())
        except BaseException:
            self.shutdown()
            raise
        if rep.header.get("version") != PROTOCOL_VERSION:
            self.shutdown()
            raise errors.EngineError(
                f"ffkit: engine protocol {rep.header.get('version')}, this package speaks {PROTOCOL_VERSION}"
            )
        self.helper_pid = rep.header.get("pid")

    def connection(self):
        """A connection of its own for a caller that pipelines requests (a
        Loader); the caller closes it."""
        return self._connection()

    def _connection(self):
        try:
            return self._idle.pop()
        except IndexError:
            pass
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._ctl_lock:
                try:
                    roundtrip(self._ctl, _protocol.ConnectRequest(), fds=[b.fileno()])
                except errors.FFKitError:
                    raise
                except OSError as e:
                    self.shutdown()
                    raise errors.EngineError(f"ffkit: lost the engine helper process: {e}") from e
                except BaseException:
                    # The control stream may be out of step: start afresh.
                    self.shutdown()
                    raise
        except BaseException:
            a.close()
            raise
        finally:
            b.close()
        return a

    def call(self, header, body=b"", fds=()):
        if self.dead:
            raise errors.EngineError("ffkit: engine is shut down")
        sock = self._connection()
        try:
            rep = roundtrip(sock, header, body, fds)
        except errors.FFKitError as e:
            if isinstance(e, errors.EngineError):
                sock.close()
                self._check_alive()
            else:
                self._idle.append(sock)  # a clean error reply: the stream is in step
            raise
        except OSError as e:
            # A broken socket: the helper died (or was killed).
            sock.close()
            self._check_alive(wait=True)
            raise errors.EngineError(f"ffkit: lost the engine helper process: {e}") from e
        except BaseException:
            # Interrupted mid-request (Ctrl-C): closing the connection
            # cancels the request in the engine.
            sock.close()
            raise
        self._idle.append(sock)
        return rep

    def _check_alive(self, wait=False):
        if self.proc is None:
            return
        try:
            if wait:
                self.proc.wait(timeout=1)
            if self.proc.poll() is not None:
                self.shutdown()
        except subprocess.TimeoutExpired:
            pass

    def shutdown(self):
        """Closes every connection; the helper exits when the control one closes."""
        self.dead = True
        idle, self._idle = self._idle, []
        for s in idle:
            s.close()
        ctl = getattr(self, "_ctl", None)
        if ctl is not None:
            ctl.close()
        proc = getattr(self, "proc", None)
        if proc is not None and self.pid == os.getpid():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def forget(self):
        """In a forked child: drop inherited descriptors without a word to the
        parent's helper (it still serves the parent)."""
        self.dead = True
        for s in self._idle:
            s.close()
        self._idle = []
        self._ctl.close()
        self.proc = None


_lock = threading.Lock()
_current = None


def get():
    """The engine of this process, started on first use and after a fork."""
    global _current
    e = _current
    if e is not None and not e.dead and e.pid == os.getpid():
        return e
    with _lock:
        e = _current
        if e is None or e.dead or e.pid != os.getpid():
            e = Engine()
            _current = e
        return e


def _after_fork_in_child():
    global _current, _lock
    _lock = threading.Lock()
    e = _current
    _current = None
    if e is not None:
        try:
            e.forget()
        except Exception:
            pass


def _at_exit():
    e = _current
    if e is not None and e.pid == os.getpid():
        e.shutdown()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


def map_segment(fd, size):
    """Maps a shared-memory segment the engine filled; closes fd. The returned
    array owns the mapping: it is unmapped when the last view of it dies."""
    try:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


def offsets(body):
    return np.frombuffer(body, dtype="<i8")


def split(rep):
    """Turns a batch reply (one segment + a [start, end) pair per sample)
    into one uint8 view per sample."""
    pos = offsets(rep.body).tolist()
    n = len(pos) // 2
    if not rep.fds:
        return [np.empty(0, dtype=np.uint8) for _ in range(n)]
    buf = map_segment(rep.fds[0], rep.header["size"])
    rep.fds = []
    return [buf[pos[2 * i] : pos[2 * i + 1]] for i in range(n)]


class Handle:
    """Something open in the engine, reopened transparently in a new helper
    (after a fork, or when the helper had to be restarted)."""

    _open_header = None

    def __init__(self):
        self._eng = None
        self._hid = None
        self._closed = False

    def _opened(self, rep):
        """Hook: called with the open reply."""

    def _ensure(self):
        if self._closed:
            raise ValueError(f"{type(self).__name__} is closed")
        e = get()
        if self._eng is not e:
            rep = e.call(self._open_header)
            self._eng, self._hid = e, rep.header["handle"]
            self._opened(rep)
        return e, self._hid

    def _call(self, header, body=b"", fds=()):
        e, hid = self._ensure()
        header["handle"] = hid
        try:
            return e.call(header, body, fds)
        except errors.EngineError:
            if e.dead:
                # The helper died: one retry in a fresh one.
                e2, hid = self._ensure()
                header["handle"] = hid
                return e2.call(header, body, fds)
            raise

    def _close_handle(self):
        e, hid = self._eng, self._hid
        self._eng = self._hid = None
        if e is not None and not e.dead and e.pid == os.getpid():
            try:
                e.call(_protocol.CloseRequest(handle=hid))
            except Exception:
                pass


# futex(2)'s system call number, by machine (the helper is Linux only).
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "ppc64le": 221,
              "ppc64": 221, "s390x": 238, "i386": 240, "i686": 240, "armv7l": 240}
_FUTEX_WAKE = 1  # on a shared mapping: no FUTEX_PRIVATE_FLAG


def futex_waker(word):
    """A function that wakes every thread sleeping on `word` (a ctypes
    c_uint32 in shared memory) with FUTEX_WAKE, or None where the system
    call is not available (the engine's sleep is bounded, so releases still
    get through, only later)."""
    call = _syscall()
    if call is None:
        return None
    # The partial keeps `word` (and so the mapping) alive with the address.
    return functools.partial(_wake, *call, ctypes.addressof(word), word)


@functools.lru_cache(maxsize=None)
def _syscall():
    """(libc's syscall(), futex's number), or None."""
    nr = _SYS_FUTEX.get(platform.machine())
    if nr is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int]
    return fn, nr


def _wake(fn, nr, addr, word):
    fn(nr, addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def map_ring(fd, size):
    """Maps a loader's ring (no pre-faulting: it is sized for the worst case)
    and closes fd. Returns the mmap object."""
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
