"""``ffkit.Loader``: shuffled, rank-sharded, resumable batches as numpy views.

The Go loader runs in the engine helper process and reads each batch straight
into a shared-memory ring that this process maps once; a batch arrives as a
slot number plus sample positions, and its samples are numpy views of the
ring. Nothing is copied into Python.

When a batch's memory is reused
-------------------------------
A batch's slot goes back to the engine when the batch is *released*:

- when ``batch.release()`` is called (or a ``with batch:`` block ends), or
- when the last reference to the batch's memory is gone: the Batch object
  and every array (or ``torch.from_numpy`` tensor) viewing it.

So views stay valid as long as you hold them, and ``release()`` is the
promise that you hold none any more (use ``batch.copy()`` for data you want to
keep past it). The ring has ``2*prefetch + 2 + hold + ahead`` slots: room
for every batch the engine plans ahead, those in flight to Python and
``hold`` batches you keep. Holding more than ``hold`` batches at once takes
slots from the read-ahead; holding every slot makes ``next()`` raise instead
of hanging.

Order and resume
----------------
The order of an epoch is a pure function of (seed, epoch, dataset size, rank,
world size). Iterating runs the current epoch to its end; the next iteration
runs the next epoch (``set_epoch`` picks one explicitly). ``state_dict()`` is
a small dict (epoch, cursor into the epoch's global stream, dataset
fingerprint) that ``load_state_dict`` accepts with any world size, rank or
batch size: it sits inside a torchdata StatefulDataLoader checkpoint as is.
"""
import collections
import ctypes
import os
import socket
import threading
import weakref

import numpy as np

from . import _engine, _protocol, errors
from .ffrecord import _paths


_META = _protocol.BATCH_META  # int64s that open a batch reply's body
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def _dist_defaults(rank, world_size):
    """rank and world size from torch.distributed when it is initialised (only
    if torch is already imported), else from RANK / WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    r = w = None
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                r, w = dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
    if r is None:
        r = int(os.environ.get("RANK", "0"))
        w = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(rank) if rank is not None else r), (int(world_size) if world_size is not None else w)


def _views(buf, pos, grid):
    """One uint8 view of buf per [start, end) row of pos. With grid = L > 0
    (the engine found every sample L bytes long at a multiple of L, the
    usual case of equal-length samples read in file order), sample i is row
    start_i / L of one 2-D view: its rows are made in C, and picking them in
    batch order costs a list lookup each, against a numpy slice each from
    Python (about twice as much in all)."""
    n = len(pos)
    if grid > 0 and n:
        k = (pos[:, 0] // grid).tolist()
        m = max(k) + 1
        if m <= 2 * n:
            rows = list(buf[: m * grid].reshape(m, grid))
            return list(map(rows.__getitem__, k))
    return [buf[s:e] for s, e in pos.tolist()]


class Batch:
    """One batch. ``batch[i]`` / ``iter(batch)`` / ``batch.samples`` give 1-D
    uint8 numpy views of shared memory, valid until the batch is released
    (see the module documentation).

    Attributes: ``indices`` (int64 array of sample indices), ``epoch``,
    ``step`` (batch number in the epoch on this rank), ``padded`` (entries at
    the end repeating earlier samples to balance ranks).
    """

    __slots__ = ("indices", "epoch", "step", "padded", "_pos", "_buf", "_fin", "_samples", "_grid", "_decode",
                 "__weakref__")

    def __init__(self, indices, epoch, step, padded, pos, buf, fin, grid=0, decode=None):
        self.indices = indices
        self.epoch = epoch
        self.step = step
        self.padded = padded
        self._pos = pos  # (n, 2) int64 [start, end) within _buf
        self._buf = buf  # uint8 view of the batch's slot
        self._fin = fin
        self._samples = None
        self._grid = grid  # L: every sample is L bytes at a multiple of L (0: not so)
        self._decode = decode  # applied to each sample view (Loader's decode=)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        if self._buf is None:
            raise ValueError("batch was released")
        s, e = self._pos[i]
        if self._decode is not None:
            return self._decode(self._buf[s:e])
        return self._buf[s:e]

    @property
    def samples(self):
        """The samples as a list of uint8 views."""
        if self._samples is None:
            if self._buf is None:
                raise ValueError("batch was released")
            self._samples = _views(self._buf, self._pos, self._grid)
            if self._decode is not None:
                self._samples = [self._decode(v) for v in self._samples]
        return self._samples

    def __iter__(self):
        return iter(self.samples)

    @property
    def data(self):
        """The slot's bytes as one uint8 array (samples are at ``positions``)."""
        return self._buf

    @property
    def positions(self):
        """(n, 2) int64 array: sample i is ``data[positions[i,0]:positions[i,1]]``."""
        return self._pos

    @property
    def lengths(self):
        return self._pos[:, 1] - self._pos[:, 0]

    def stack(self):
        """The samples as one (n, L) uint8 array when they all have length L:
        a view when they lie end to end in order, else a copy."""
        lens = self.lengths
        n = len(lens)
        if n == 0:
            return np.empty((0, 0), dtype=np.uint8)
        L = int(lens[0])
        if not (lens == L).all():
            raise ValueError("samples have different lengths")
        start = int(self._pos[0, 0])
        if (self._pos[:, 0] == start + L * np.arange(n)).all():
            return self._buf[start : start + n * L].reshape(n, L)
        return np.stack(self.samples)

    def copy(self):
        """Copies of the samples (owned arrays, valid after release)."""
        return [s.copy() for s in self.samples]

    def release(self):
        """Hands the batch's memory back to the loader now. Views of it must
        not be used afterwards."""
        fin, self._fin = self._fin, None
        self._buf = None
        self._samples = None
        if fin is not None:
            fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"Batch(epoch={self.epoch}, step={self.step}, n={len(self)})"


def _decoder(name):
    """The per-sample decode function for Loader's decode= (None: none)."""
    if name is None:
        return None
    if name == "webdataset":
        from ._pack import decode_webdataset

        return decode_webdataset
    raise errors.UsageError(f"ffkit: decode must be None or 'webdataset', got {name!r}")


def _direct_mode(direct):
    """Loader's direct= as the engine's "off" / "on" / "auto"."""
    if direct is None or direct is False:
        return "off"
    if direct is True:
        return "on"
    if isinstance(direct, str) and direct.lower() in ("off", "on", "auto"):
        return direct.lower()
    raise errors.UsageError(f"ffkit: direct must be True, False, 'on', 'off' or 'auto', got {direct!r}")


class Loader:
    """Batches of one rank's share of an FFRecord dataset.

    Args:
        path: a .ffr file, a directory of them, or a list of both.
        batch_size: samples per batch on this rank.
        shuffle: an exact pseudorandom permutation per epoch (default True).
        seed: keys the shuffle.
        rank, world_size: this process's share; default from
            torch.distributed (when initialised) or RANK / WORLD_SIZE.
        drop_last: drop what does not fill a batch on every rank.
        prefetch: batches prepared ahead (default 4).
        check_data: verify each sample's CRC-32 (default True).
        hold: batches you may hold unreleased at once (default 2).
        memory_budget: bytes of the shared ring (default: room for the
            largest possible batch in every slot; the ring is sparse).
        workers: reads in flight per batch (default 64).
        skip_bad: substitute bad samples (logged) instead of failing.
        direct: how reads meet the page cache: False or "off" (buffered,
            the default), True or "on" (O_DIRECT: bypass the page cache),
            or "auto": chosen per dataset when the loader opens, O_DIRECT
            only when the dataset is more than 4x the memory the page cache
            can use (and less than half of it is cached). ``stats()
            ["direct_choice"]`` says what was chosen and why; see
            docs/loader.md, "Direct reads".
        block_size: block shuffle (samples of a block stay together).
        ahead: extra ring slots for batches the engine has pushed into the
            socket but you have not taken yet (default 2). The engine streams
            batches as they are ready; you give them back through a release
            board in the shared memory, so a batch costs no request.
        decode: None (samples are uint8 views), or "webdataset": each sample
            (packed with ``ffkit pack --format webdataset``) is a dict
            ``{ext: memoryview}`` of views into the batch's memory, no copy
            (see ``ffkit.decode_webdataset``).
    """

    def __init__(self, path, batch_size, shuffle=True, seed=0, rank=None, world_size=None, drop_last=False,
                 prefetch=4, check_data=True, hold=2, memory_budget=None, workers=None, skip_bad=False,
                 direct=False, block_size=0, ahead=2, decode=None):
        self._decode_name = decode
        self._decode = _decoder(decode)
        rank, world_size = _dist_defaults(rank, world_size)
        self.paths = _paths(path)
        self.batch_size = int(batch_size)
        self.hold = int(hold)
        self._open_header = _protocol.LoaderOpenRequest(
            paths=self.paths, batch_size=self.batch_size, shuffle=shuffle, seed=seed, rank=rank,
            world_size=world_size, drop_last=drop_last, prefetch=prefetch, hold=self.hold, check_data=check_data,
            direct=_direct_mode(direct), workers=workers or 0, memory_budget=memory_budget or 0, skip_bad=skip_bad,
            block_size=block_size, ahead=ahead,
        )
        self.ahead = max(0, int(ahead))
        self.rank, self.world_size = rank, world_size
        self._eng = None
        self._hid = None
        self._gen = 0
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._state = None  # full state after the last batch handed out
        self._stash = None  # first batch of the next epoch, read ahead
        self._closed = False
        self._sock = None  # the engine's stream of batches (an _engine.Pipe)
        self._streams = 0  # streams opened (their numbers are 1, 2, ...)
        self._fenced = 0  # the last stream number sent in a reclaim
        self._needs_rewind = False
        self._ensure()
        self._epoch = self._state["epoch"]

    # -- engine plumbing ---------------------------------------------------

    def _ensure(self):
        if self._closed:
            raise ValueError("Loader is closed")
        e = _engine.get()
        if self._eng is e:
            return e
        if self._pid != os.getpid():
            # Forked: the inherited lock, ring, socket and batches belong to
            # the parent.
            self._lock = threading.RLock()
            self._pid = os.getpid()
            self._stash = None
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._fenced = self._streams  # the old streams served another handle
        self._needs_rewind = False
        rep = e.call(dict(self._open_header))
        h = rep.header
        # The ring's memfd stays open (a dup) so that other processes can map
        # the ring: ffkit.torch.DataLoader passes it to its workers.
        fd, rep.fds = rep.fds[0], []
        try:
            ring_fd = os.dup(fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            ring = _engine.map_ring(fd, h["board"] + h["slots"] * h["slot_size"])
        except BaseException:
            os.close(ring_fd)
            raise
        self._close_ring_fd()
        self._ring_fd = ring_fd
        self._gen += 1
        self._eng, self._hid = e, h["handle"]
        self._ring = ring
        self._slots, self._slot_size, self._board_bytes = h["slots"], h["slot_size"], h["board"]
        # The release board: Python writes a batch's lend number into its
        # slot's word when it is done; the engine reads it (no system call),
        # unless it sleeps waiting for a slot: then the release also bumps
        # the wake word and wakes it (futex).
        self._board = np.frombuffer(ring, dtype="<u4", count=self._board_bytes // 4)
        ww = h["wake_word"]
        self._waiting = h["waiting_word"]
        self._wake_word = self._board[ww : ww + 1]
        self._waker = _engine.futex_waker(ctypes.c_uint32.from_buffer(ring, 4 * ww))
        self._slot_type = ctypes.c_uint8 * self._slot_size
        self.n = h["n"]
        self._batches = h["batches_per_epoch"]
        self._handed = 0  # batches handed out and not yet counted released
        self._released = collections.deque()  # slots released (appended by finalizers)
        self._live = set()  # slots handed out and not yet released
        self._refs = {}  # slot -> weakref to its lent memory (callback releases)
        template = h["state"]
        if self._state is not None:
            # A new helper (fork, or the old one died): continue where we were.
            state = dict(self._state)
            if state["cursor"] == 0 and state["step"] == 0:
                rep = e.call(_protocol.LoaderSetEpochRequest(handle=self._hid, epoch=state["epoch"]))
            else:
                rep = e.call(_protocol.LoaderRestoreRequest(handle=self._hid, state=state))
            template = rep.header["state"]
        self._state = template
        return e

    def _close_ring_fd(self):
        fd, self._ring_fd = getattr(self, "_ring_fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _call(self, header, seek=True):
        e = self._ensure()
        if seek:
            # A seek: stop the stream and take back what it sent ahead.
            self._stop_stream(e)
            self._needs_rewind = False
        header["handle"] = self._hid
        return e.call(header)

    def _drain(self):
        """Counts the batches released since the last call."""
        rel = self._released
        while rel:
            slot = rel.popleft()
            self._handed -= 1
            self._live.discard(slot)

    @staticmethod
    def _releaser(board, released, refs, slot, seq, pid, waiting, wake_word, waker):
        """The function that gives slot back (lend seq) exactly once: called
        by Batch.release(), or as the weakref callback when the slot's memory
        is garbage. No locks; a system call only when the engine sleeps
        waiting for a slot. In a forked child the board belongs to the
        parent's engine: a copy of a batch dying there must not free the
        parent's slot."""

        def fin(ref=None):
            if refs.pop(slot, None) is None or os.getpid() != pid:
                return
            board[slot] = seq
            released.append(slot)
            # The engine, when it waits for a slot, names the lend number
            # whose release should wake it (about half the lent slots).
            w = board.item(waiting)
            if w and (seq - w) & 0xFFFFFFFF < 0x80000000:
                np.add(wake_word, 1, out=wake_word)  # wraps around silently
                if waker is not None:
                    waker()

        return fin

    @staticmethod
    def _starving(board, waiting, wake_word, waker):
        """The stream's hook before waiting with nothing received: an engine
        that sleeps for a slot until more batches are back (when more than
        hold are held) is woken now, so that it sends what it can. (Not a
        bound method: the stream must not keep the Loader alive.)"""

        def starving(sock):
            if not board.item(waiting):
                return
            try:
                if sock.recv(1, _PEEK):
                    return  # more batches are in the socket: no need yet
            except BlockingIOError:
                pass
            np.add(wake_word, 1, out=wake_word)
            if waker is not None:
                waker()

        return starving

    # -- iteration ---------------------------------------------------------

    def __len__(self):
        """Batches per epoch on this rank."""
        return self._batches

    def _stop_stream(self, e):
        """Closes the stream and gets back the slots of batches it sent that
        we never handed out."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fenced != self._streams:
            self._reclaim(e)

    def _reclaim(self, e):
        """Takes back every lent slot but those handed out and still held.
        The request names the last stream opened: the engine waits until
        that stream and every earlier one have stopped, and refuses to start
        one it has not read yet (its request may still sit in the closed
        socket: started after a rewind, it would take a batch from the new
        position and lose it on the closed socket)."""
        self._drain()
        e.call(_protocol.LoaderReclaimRequest(handle=self._hid, keep=sorted(self._live), stream=self._streams))
        self._fenced = self._streams

    def _abandon(self):
        """After an error or an interrupt: the stream goes, and the next fetch
        rewinds to the last batch handed out, so nothing is skipped."""
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._needs_rewind = True

    def _rewind(self, e):
        self._reclaim(e)
        st = self._state
        if st["cursor"] == 0 and st["step"] == 0:
            e.call(_protocol.LoaderSetEpochRequest(handle=self._hid, epoch=st["epoch"]))
        else:
            e.call(_protocol.LoaderRestoreRequest(handle=self._hid, state=dict(st)))
        self._needs_rewind = False

    def _fetch(self):
        e = self._ensure()
        self._drain()
        if self._handed >= self._slots:
            import gc

            gc.collect()
            self._drain()
            if self._handed >= self._slots:
                raise errors.UsageError(
                    f"ffkit.Loader: {self._handed} batches are held unreleased and the ring has "
                    f"{self._slots} slots; release batches (batch.release(), or drop references), "
                    f"copy what you keep (batch.copy()), or raise hold= (now {self.hold})"
                )
        try:
            if self._needs_rewind:
                self._rewind(e)
            if self._sock is None:
                self._sock = _engine.Pipe(e.connection())
                self._sock.on_empty = Loader._starving(self._board, self._waiting, self._wake_word, self._waker)
                self._streams += 1
                self._sock.send(_protocol.LoaderStreamRequest(handle=self._hid, stream=self._streams))
            rep = self._sock.recv()
        except errors.EngineError:
            self._abandon()
            e._check_alive(wait=True)
            raise
        except errors.FFKitError:
            self._abandon()
            raise
        except OSError as err:
            self._abandon()
            e._check_alive(wait=True)
            raise errors.EngineError(f"ffkit: lost the engine helper process: {err}") from err
        except BaseException:
            self._abandon()
            raise
        try:
            return self._batch(rep)
        except BaseException:
            # Interrupted between receiving the batch and handing it out:
            # rewind so that it is delivered again.
            self._abandon()
            raise

    def _batch(self, rep):
        h = rep.header
        if h.get("end"):
            return None
        # A batch reply's body (an int64 array of its own): slot, lend
        # number, n, epoch, step, padded, state (epoch, cursor, step), grid
        # (L if every sample is L bytes at a multiple of L, else 0), n
        # indices, n [start, end) pairs.
        body = rep.body
        # The layout is _protocol.BATCH_FIELDS (the engine's schema).
        slot, seq, n, epoch, step, padded, s_epoch, s_cursor, s_step, grid = body[:_META].tolist()
        indices = body[_META : _META + n]
        pos = body[_META + n :].reshape(n, 2)
        mem = self._slot_type.from_buffer(self._ring, self._board_bytes + slot * self._slot_size)
        buf = np.frombuffer(mem, dtype=np.uint8)
        state = dict(self._state, epoch=s_epoch, cursor=s_cursor, step=s_step)
        # A weakref (cheaper than weakref.finalize) kept in _refs until the
        # slot is released, by release() or by the memory dying.
        fin = Loader._releaser(self._board, self._released, self._refs, slot, seq, self._pid, self._waiting,
                               self._wake_word, self._waker)
        self._refs[slot] = weakref.ref(mem, fin)
        self._handed += 1
        self._live.add(slot)
        self._state = state
        return Batch(indices, epoch, step, padded, pos, buf, fin, grid, self._decode)

    def __iter__(self):
        epoch = self._epoch
        while True:
            with self._lock:
                b = self._stash
                self._stash = None
                if b is None:
                    b = self._fetch()
                if b is None:
                    return
                if b.epoch != epoch:
                    # The engine ran ahead into the next epoch: keep the batch
                    # for the next iteration.
                    self._stash = b
                    self._epoch = b.epoch
                    return
            yield b
            if self._state["epoch"] != epoch:
                self._epoch = self._state["epoch"]
                return

    def set_epoch(self, epoch):
        """Makes the next iteration run epoch ``epoch`` from its start."""
        with self._lock:
            stash, self._stash = self._stash, None
            if stash is not None:
                stash.release()
            rep = self._call(_protocol.LoaderSetEpochRequest(epoch=epoch))
            self._state = rep.header["state"]
            self._epoch = int(epoch)

    def state_dict(self):
        """Where the loader stands after the last batch handed out: a small
        JSON-able dict (epoch, cursor, seed, dataset fingerprint...)."""
        return dict(self._state)

    def load_state_dict(self, state):
        """Continues from a state_dict (any rank, world size or batch size);
        refused for other data or another shuffle."""
        with self._lock:
            stash, self._stash = self._stash, None
            if stash is not None:
                stash.release()
            rep = self._call(_protocol.LoaderRestoreRequest(state=dict(state)))
            self._state = rep.header["state"]
            self._epoch = self._state["epoch"]

    @property
    def epoch(self):
        return self._epoch

    def stats(self):
        """The Go loader's counters (batches, bytes, read time, stalls...)."""
        return self._call(_protocol.LoaderStatsRequest(), seek=False).header["stats"]

    def close(self):
        if self._closed:
            return
        self._stash = None
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        self._sock = None
        e, hid = self._eng, self._hid
        self._eng = self._hid = None
        self._closed = True
        self._close_ring_fd()
        if e is not None and not e.dead and e.pid == os.getpid():
            try:
                e.call(_protocol.CloseRequest(handle=hid))
            except Exception:
                pass

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
        return {"open": self._open_header, "state": self._state, "epoch": self._epoch,
                "batch_size": self.batch_size, "hold": self.hold, "paths": self.paths,
                "rank": self.rank, "world_size": self.world_size, "decode": self._decode_name}

    def __setstate__(self, st):
        self._open_header = st["open"]
        self.paths, self.batch_size, self.hold = st["paths"], st["batch_size"], st["hold"]
        self.rank, self.world_size = st["rank"], st["world_size"]
        self._decode_name = st.get("decode")
        self._decode = _decoder(self._decode_name)
        self._eng = self._hid = None
        self._gen = 0
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._state = st["state"]
        self._stash = None
        self._closed = False
        self.ahead = max(0, int(self._open_header.get("ahead", 2)))
        self._sock = None
        self._streams = self._fenced = 0
        self._needs_rewind = False
        self._ensure()
        self._epoch = st["epoch"]
