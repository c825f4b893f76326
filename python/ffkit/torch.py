"""PyTorch integration: ``ffkit.torch.Dataset``, an IterableDataset over
``ffkit.Loader`` that shards across DataLoader workers and ranks.

Use it with ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k)``
(the dataset yields whole batches). With ``num_workers=0`` the tensors are
``torch.from_numpy`` views of the engine's shared memory: no copy. With
workers, PyTorch itself moves each batch to the main process (its one copy).

Sharding: worker w of k on rank r of W reads as rank ``r*k + w`` of ``W*k``,
so every sample of an epoch is read exactly once across all workers and
ranks, every worker gets the same number of batches, and with one rank the
DataLoader's round-robin over workers delivers the global order.

Epochs: call ``ds.set_epoch(e)`` before iterating (as with
DistributedSampler) unless the workers are persistent, in which case each
new iteration continues with the next epoch by itself. ``state_dict`` /
``load_state_dict`` make the dataset Stateful for torchdata's
StatefulDataLoader.

``ffkit.torch.DataLoader`` is the faster way to use workers: the main
process reads every batch (one engine, batched parallel reads, straight into
its shared ring) and the worker processes only run the transform on views of
that ring, so the batches and their order are those of ``num_workers=0`` for
any number of workers, and the resume state is the loader's.
"""
import atexit
import collections
import io
import multiprocessing.reduction
import os
import pickle
import random
import select
import sys
import threading
import time

import numpy as np
import torch
import torch.multiprocessing
import torch.utils.data

from . import errors
from .ffrecord import _paths
from .loader import Batch, Loader, _decoder, _dist_defaults

__all__ = ["DataLoader", "Dataset", "WorkerInfo", "get_worker_info", "to_tensors"]


def to_tensors(batch):
    """The default conversion: {"indices": int64 tensor, "samples": ...}, all
    views of the batch's shared memory (no copy).

    When every sample has the same length L (and none repeats another's
    bytes), "samples" is one (n, L) uint8 tensor whose rows are the samples
    in the order they lie in memory, and "indices" follows that order: one
    tensor instead of n is much cheaper, and in a DataLoader worker PyTorch
    moves it to the main process in one piece. Otherwise "samples" is a list
    of 1-D uint8 tensors in delivery order (views of one tensor).
    """
    pos = batch.positions
    n = len(pos)
    if n == 0:
        return {"indices": torch.from_numpy(batch.indices), "samples": []}
    L = batch._grid
    if L > 0:
        # Every sample is L bytes at a multiple of L (the engine checked):
        # row k of the slot holds the samples whose start is k * L. When
        # the rows k0..k0+n-1 hold the n samples once each, the order of
        # the rows is found by one scatter, not a sort.
        # The rows usually start at the slot's start (k0 = 0): tried first,
        # an index past n says otherwise.
        k = pos[:, 0] // L
        order = np.empty(n, np.int64)
        order.fill(-1)
        k0 = 0
        try:
            order[k] = np.arange(n)
        except IndexError:
            k0 = int(k.min())
            order.fill(-1)
            if int(k.max()) - k0 < n:
                order[k - k0] = np.arange(n)
        if order.min() >= 0:
            rows = batch.data[k0 * L : (k0 + n) * L].reshape(n, L)
            return {"indices": torch.from_numpy(batch.indices[order]), "samples": torch.from_numpy(rows)}
    lens = pos[:, 1] - pos[:, 0]
    L = int(lens[0])
    if L > 0 and (lens == L).all():
        order = np.argsort(pos[:, 0], kind="stable")
        starts = pos[order, 0]
        first = int(starts[0])
        if (starts == first + L * np.arange(n)).all():
            rows = batch.data[first : first + n * L].reshape(n, L)
            return {"indices": torch.from_numpy(batch.indices[order]), "samples": torch.from_numpy(rows)}
    lo, hi = int(pos[:, 0].min()), int(pos[:, 1].max())
    span = torch.from_numpy(batch.data[lo:hi])
    rel = (pos - lo).tolist()
    return {
        "indices": torch.from_numpy(batch.indices),
        "samples": [span[s:e] for s, e in rel],
    }


class Dataset(torch.utils.data.IterableDataset):
    """Batches of an FFRecord dataset for a torch DataLoader (batch_size=None).

    Args:
        path, batch_size, shuffle, seed, drop_last, **loader_options: as
            ``ffkit.Loader``.
        rank, world_size: default from torch.distributed or RANK/WORLD_SIZE.
        transform: called with each ``ffkit.loader.Batch``; its result is
            what the DataLoader yields (default ``to_tensors``). It may decode
            samples; the batch is released once it returns unless the result
            views the batch's memory (views keep it alive).
    """

    def __init__(self, path, batch_size, shuffle=True, seed=0, rank=None, world_size=None, drop_last=False,
                 transform=None, **loader_options):
        super().__init__()
        self.path = path
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.drop_last = drop_last
        self.transform = transform or to_tensors
        self.loader_options = loader_options
        self._epoch = 0
        self._state = None  # to restore on the next loader created
        self._loader = None
        self._key = None

    def _shard(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * nw + wid, self.world_size * nw

    def _get_loader(self):
        rank, world = self._shard()
        key = (os.getpid(), rank, world)
        if self._loader is None or self._key != key:
            self._loader = Loader(self.path, self.batch_size, shuffle=self.shuffle, seed=self.seed, rank=rank,
                                  world_size=world, drop_last=self.drop_last, **self.loader_options)
            self._key = key
            if self._state is not None:
                self._loader.load_state_dict(self._state)
                self._state = None
            elif self._epoch:
                self._loader.set_epoch(self._epoch)
        return self._loader

    def __iter__(self):
        loader = self._get_loader()
        if self._state is not None:
            loader.load_state_dict(self._state)
            self._state = None
        for b in loader:
            out = self.transform(b)
            yield out
        self._epoch = loader.epoch

    def __len__(self):
        """Batches per epoch on this rank (all its DataLoader workers together)."""
        from .ffrecord import FileReader

        if self._loader is not None:
            n = self._loader.n
        else:
            with FileReader(self.path, check_data=False) as r:
                n = r.n
        if self.drop_last:
            return n // (self.world_size * self.batch_size)
        return -(-(-(-n // self.world_size)) // self.batch_size)

    def set_epoch(self, epoch):
        self._epoch = int(epoch)
        self._state = None
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def state_dict(self):
        if self._loader is not None:
            return {"loader": self._loader.state_dict(), "epoch": self._loader.epoch}
        return {"loader": self._state, "epoch": self._epoch}

    def load_state_dict(self, state):
        self._state = state.get("loader")
        self._epoch = state.get("epoch", 0)
        if self._loader is not None and self._state is not None:
            self._loader.load_state_dict(self._state)
            self._state = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_loader"] = None
        d["_key"] = None
        return d


# --- DataLoader: reads in the main process, transforms in the workers ------

# Results of a worker's transform cross to the main process pickled: tensors
# and arrays that view the ring go as (offset, shape, strides, dtype) and come
# back as views of the main process's own mapping (no copy; they keep the
# batch's slot lent while they live); other tensors up to _BY_VALUE bytes go
# by value (cheaper than a shared-memory segment each), larger ones through
# PyTorch's own shared memory (its ForkingPickler reductions).
_BY_VALUE = 1 << 20
_POLL_S = 5.0  # how often a waiting side checks that its peer still lives

# Workers outlive their DataLoader in a small pool, so that the next
# DataLoader (or the next epoch of one without persistent_workers) with the
# same transform starts without forking: a fork of a process with torch
# loaded, and the new worker's first batch, cost 100-300 ms on a loaded
# 2-CPU machine, as much as a whole epoch of a small dataset. A set of
# workers is reused only by a DataLoader whose transform, decode and
# worker_init_fn pickle to the same bytes (so the workers hold the same
# code and state as fresh ones would) and with the same start method and
# worker count; it is reseeded for each use. Idle workers drop their
# mapping of the ring and exit by themselves after _IDLE_S unused.
_IDLE_S = 20.0
_POOL_ON = os.environ.get("FFKIT_TORCH_POOL", "1") != "0"  # 0: every DataLoader forks its own
_POOL_SETS = 2  # idle worker sets kept per key
_POOL_KEY_MAX = 1 << 16  # a transform that pickles larger is not pooled
_pool_lock = threading.Lock()  # guards _pool and _pool_pid
_pool = {}  # key -> [(time.monotonic() when pooled, workers)]
_pool_pid = None  # the process the pool belongs to (a forked child starts empty)


def _pool_take(key):
    """An idle worker set for key, or None."""
    global _pool_pid
    now = time.monotonic()
    stale = []
    got = None
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool.clear()  # a forked child: the workers are its parent's
            _pool_pid = os.getpid()
        sets = _pool.get(key, [])
        while sets:
            since, ws = sets.pop()
            # Near its idle limit a worker may be exiting: do not race it.
            if now - since < _IDLE_S / 2 and all(p.is_alive() for p, *_ in ws):
                got = ws
                break
            stale.append(ws)
    for ws in stale:
        _stop(ws)
    return got


def _pool_put(key, ws):
    """Keeps an idle worker set for key (False: the pool is full)."""
    global _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool.clear()
            _pool_pid = os.getpid()
        sets = _pool.setdefault(key, [])
        if len(sets) >= _POOL_SETS:
            return False
        sets.append((time.monotonic(), ws))
    return True


def _pool_close():
    """Stops every pooled worker (at exit)."""
    with _pool_lock:
        sets = [ws for v in _pool.values() for _, ws in v] if _pool_pid == os.getpid() else []
        _pool.clear()
    for ws in sets:
        _stop(ws)


def _stop(workers):
    """Tells the workers to exit and waits for them."""
    for p, conn, *_ in workers:
        try:
            conn.send_bytes(pickle.dumps(None))
        except (OSError, ValueError):
            pass
    for p, conn, *_ in workers:
        p.join(timeout=_POLL_S)
        if p.is_alive():
            p.kill()
            p.join()
        conn.close()


atexit.register(_pool_close)


_INFLIGHT_BYTES = 16 << 20  # ring bytes in flight per worker that the default prefetch_factor aims at


def _default_prefetch(path, batch_size):
    """prefetch_factor for batches of batch_size samples of path: as many
    batches as fit in _INFLIGHT_BYTES, between 2 and 16 and even (chunks of
    half of it), from the mean sample size of the files' headers; 4 when
    the files are not local. Large batches need no long chunks (the
    message is nothing beside the batch) and each slot in flight is ring
    memory that the engine fills and the kernel first has to fault in.

    At 4 KiB samples the hand-off to the workers costs more per message
    than the transform itself: chunks of 8 batches took the CPU per batch of
    the main process and the workers from 313+312 to 78-195+78-195 us
    (steady state, 2 workers; docs/perf/python.md)."""
    try:
        total = n = 0
        for p in _paths(path):
            if "://" in p:
                return 4
            files = [p]
            if os.path.isdir(p):
                files = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".ffr"))
            for f in files:
                with open(f, "rb") as fh:
                    head = fh.read(12)
                    size = os.fstat(fh.fileno()).st_size
                if len(head) < 12:
                    return 4
                k = int.from_bytes(head[4:12], "little")
                total, n = total + size - 12 - 12 * k, n + k
    except (OSError, TypeError, ValueError):
        return 4
    if n <= 0 or total <= 0:
        return 4
    per_batch = total / n * max(1, batch_size)
    pf = int(_INFLIGHT_BYTES // per_batch) // 2 * 2
    return min(16, max(2, pf))


class WorkerInfo:
    """What a transform running in an ``ffkit.torch.DataLoader`` worker can
    learn about where it runs: ``id``, ``num_workers`` and ``seed`` (the
    worker's torch and ``random`` seed, different per worker and per
    iteration)."""

    __slots__ = ("id", "num_workers", "seed")

    def __init__(self, id, num_workers, seed):
        self.id, self.num_workers, self.seed = id, num_workers, seed

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_worker_info = None


def get_worker_info():
    """In an ``ffkit.torch.DataLoader`` worker, its WorkerInfo; in a torch
    DataLoader worker, torch's; else None."""
    if _worker_info is not None:
        return _worker_info
    return torch.utils.data.get_worker_info()


def _extent(shape, strides, itemsize):
    """Bytes spanned by an array of that shape and (non-negative) byte strides."""
    if 0 in shape:
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize


class _Pickler(pickle.Pickler):
    """A worker's result pickler: views of the ring [lo, hi) become calls
    of _ring_tensor / _ring_array / _ring_memoryview naming their place in
    the ring; small tensors go by value; everything else pickles as with
    multiprocessing's ForkingPickler (PyTorch's shared-memory reductions
    included), whose dispatch table is copied once, not per result.

    reducer_override (not persistent_id) because the pickler calls it only
    for objects that are not plain ints, strs, tuples, lists or dicts: a
    typical result (a dict of a few tensors) costs a few Python calls, not
    one per element of every shape and key."""

    _table = None

    def __init__(self, f, lo, hi):
        if _Pickler._table is None:
            import copyreg

            table = copyreg.dispatch_table.copy()
            table.update(multiprocessing.reduction.ForkingPickler._extra_reducers)
            _Pickler._table = table
        self.dispatch_table = _Pickler._table
        super().__init__(f, pickle.HIGHEST_PROTOCOL)
        self._lo, self._hi = lo, hi

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            if (obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad
                    or obj.is_quantized or obj.numel() == 0):
                return NotImplemented
            es = obj.element_size()
            ptr = obj.data_ptr()
            if self._lo <= ptr < self._hi:
                strides = tuple(s * es for s in obj.stride())
                if min(strides, default=0) >= 0 and ptr + _extent(obj.shape, strides, es) <= self._hi:
                    return _ring_tensor, (ptr - self._lo, tuple(obj.shape), strides, obj.dtype)
            if obj.numel() * es <= _BY_VALUE and type(obj) is torch.Tensor:
                c = obj.contiguous()
                raw = c.view(torch.uint8) if c.dim() else c.reshape(1).view(torch.uint8)
                return _value_tensor, (raw.numpy().tobytes(), tuple(obj.shape), obj.dtype)
            return NotImplemented
        if isinstance(obj, np.ndarray):
            if obj.size == 0 or obj.dtype.hasobject:
                return NotImplemented
            ptr = obj.__array_interface__["data"][0]
            if self._lo <= ptr < self._hi and min(obj.strides, default=0) >= 0:
                if ptr + _extent(obj.shape, obj.strides, obj.itemsize) <= self._hi:
                    return _ring_array, (ptr - self._lo, obj.shape, obj.strides, obj.dtype.str)
            return NotImplemented
        if isinstance(obj, memoryview):
            if obj.c_contiguous and obj.nbytes:
                ptr = np.frombuffer(obj.cast("B") if obj.format != "B" or obj.ndim != 1 else obj,
                                    np.uint8).__array_interface__["data"][0]
                if self._lo <= ptr and ptr + obj.nbytes <= self._hi:
                    return _ring_memoryview, (ptr - self._lo, obj.nbytes)
            return _value_memoryview, (obj.tobytes(),)
        return NotImplemented


class _Slot:
    """Where the ring views of a result being unpickled land: the batch's
    slot (a uint8 numpy view of the main process's ring) at slot_off."""

    __slots__ = ("buf", "slot_off", "base", "views")

    def __init__(self, buf, slot_off):
        self.buf, self.slot_off, self.base, self.views = buf, slot_off, None, 0

    def place(self, off, nbytes):
        rel = off - self.slot_off
        if rel < 0 or rel + nbytes > len(self.buf):
            raise errors.UsageError(
                "ffkit.torch.DataLoader: a worker's transform returned a view of memory outside its batch "
                "(keep no views of earlier batches in the worker; copy what you keep)")
        self.views += 1
        return rel


_unpickling = threading.local()  # .slot: the _Slot of the result being unpickled in this thread


def _slot():
    slot = getattr(_unpickling, "slot", None)
    if slot is None:
        raise pickle.UnpicklingError("ffkit.torch: a view of a DataLoader ring outside its DataLoader")
    return slot


def _ring_tensor(off, shape, strides, dtype):
    return _slot_view(_slot(), off, shape, strides, dtype)


def _slot_view(slot, off, shape, strides, dtype):
    """The tensor of dtype, shape and byte strides at ring offset off of
    slot (a _Slot), viewing its memory."""
    es = dtype.itemsize
    n = _extent(shape, strides, es)
    rel = slot.place(off, n)
    if slot.base is None:
        slot.base = torch.from_numpy(slot.buf)
    seg = slot.base[rel : rel + n]
    if dtype != torch.uint8:
        seg = seg.view(dtype)
    if len(shape) == 1 and strides[0] == es:
        return seg
    return seg.as_strided(shape, tuple(s // es for s in strides))


def _ring_array(off, shape, strides, dtype):
    slot = _slot()
    dt = np.dtype(dtype)
    rel = slot.place(off, _extent(shape, strides, dt.itemsize))
    return np.ndarray(shape, dt, buffer=slot.buf, offset=rel, strides=strides)


def _ring_memoryview(off, n):
    slot = _slot()
    rel = slot.place(off, n)
    return memoryview(slot.buf[rel : rel + n])


def _value_tensor(raw, shape, dtype):
    if not raw:
        return torch.empty(shape, dtype=dtype)
    t = torch.frombuffer(bytearray(raw), dtype=dtype)
    return t if len(shape) == 1 else t.reshape(shape)


def _value_memoryview(raw):
    return memoryview(bytearray(raw))


def _unpickle_result(data, buf, slot_off):
    """A worker's result (bytes after the one-byte tag) as objects whose
    ring views view buf, the batch's slot at slot_off; and whether any
    does."""
    slot = _Slot(buf, slot_off)
    _unpickling.slot = slot
    try:
        out = pickle.loads(memoryview(data)[1:])
    finally:
        _unpickling.slot = None
    return out, slot.views


# The common results (a tensor, or dicts, lists and tuples of tensors and
# plain scalars, as to_tensors and most transforms return) skip the pickler:
# the worker encodes them as a tree of plain tuples, which the chunk's one
# pickle.dumps writes in C, and the main process builds the tensors from it
# directly. Per 256-sample batch of to_tensors that took the worker's
# encoding from 16 to 3 us and the main process's decoding from 17 to 6 us
# (docs/perf/python.md). Anything else (numpy arrays, memoryviews, other
# objects, big tensors for PyTorch's shared memory) goes through _Pickler.
_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.bool)
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}
_PLAIN = (int, float, str, bytes, bool, type(None))
_FAST_DEPTH = 4  # deeper results go through the pickler
_RING, _VALUE, _DICT, _LIST, _TUPLE, _SCALAR = range(6)


class _Slow(Exception):
    """A result the fast encoding does not cover."""


def _fast_encode(obj, lo, hi, depth=0, seen=None):
    """obj as a tree of plain tuples (see _DTYPES above), or raises _Slow.
    Tensors viewing the ring [lo, hi) become (_RING, offset, shape, byte
    strides, dtype code); other tensors up to _BY_VALUE bytes go by value.
    A tensor, dict or list met twice goes to the pickler, which keeps it
    one object (the tree would make two)."""
    t = type(obj)
    if t in _PLAIN:
        return (_SCALAR, obj)
    if seen is None:
        seen = set()
    if id(obj) in seen:
        raise _Slow
    seen.add(id(obj))
    if t is torch.Tensor:
        code = _DTYPE_CODE.get(obj.dtype)
        if (code is None or obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad
                or obj.numel() == 0):
            raise _Slow
        es = obj.element_size()
        ptr = obj.data_ptr()
        if lo <= ptr < hi:
            strides = tuple([s * es for s in obj.stride()])
            if min(strides, default=0) >= 0 and ptr + _extent(obj.shape, strides, es) <= hi:
                return (_RING, ptr - lo, tuple(obj.shape), strides, code)
            raise _Slow
        if obj.numel() * es > _BY_VALUE:
            raise _Slow
        c = obj.contiguous()
        raw = c.view(torch.uint8) if c.dim() else c.reshape(1).view(torch.uint8)
        return (_VALUE, raw.numpy().tobytes(), tuple(obj.shape), code)
    if depth >= _FAST_DEPTH:
        raise _Slow
    if t is dict:
        keys = tuple(obj)
        if not all(type(k) is str for k in keys):
            raise _Slow
        return (_DICT, keys, tuple([_fast_encode(v, lo, hi, depth + 1, seen) for v in obj.values()]))
    if t is list:
        return (_LIST, [_fast_encode(v, lo, hi, depth + 1, seen) for v in obj])
    if t is tuple:
        return (_TUPLE, tuple([_fast_encode(v, lo, hi, depth + 1, seen) for v in obj]))
    raise _Slow


def _fast_decode(node, slot):
    """The object _encode made node from, its ring views viewing slot (a
    _Slot)."""
    kind = node[0]
    if kind == _RING:
        _, off, shape, strides, code = node
        return _slot_view(slot, off, shape, strides, _DTYPES[code])
    if kind == _DICT:
        return dict(zip(node[1], [_fast_decode(v, slot) for v in node[2]]))
    if kind == _SCALAR:
        return node[1]
    if kind == _VALUE:
        _, raw, shape, code = node
        t = torch.frombuffer(bytearray(raw), dtype=_DTYPES[code])
        return t if len(shape) == 1 else t.reshape(shape)
    if kind == _LIST:
        return [_fast_decode(v, slot) for v in node[1]]
    return tuple([_fast_decode(v, slot) for v in node[1]])


def _worker_loop(wid, num_workers, conn, transform, decode, seed, init_fn, parent):
    """A DataLoader worker: maps the ring it is sent, runs the transform on
    each batch it is sent and sends back the result, in order. It never
    talks to the engine (the main process reads), and exits when told, when
    the main process's end closes, or when the main process is gone."""
    global _worker_info
    import signal

    # Ctrl-C is the main process's to handle: it stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    random.seed(seed)
    torch.manual_seed(seed)
    _worker_info = WorkerInfo(wid, num_workers, seed)
    tw = None
    try:
        from torch.utils.data._utils import worker as tw

        # So that torch.utils.data.get_worker_info() answers in transforms too.
        tw._worker_info = tw.WorkerInfo(id=wid, num_workers=num_workers, seed=seed, dataset=None)
    except Exception:
        pass
    decode = _decoder(decode)
    ring, lo, hi = None, 0, 0
    idle = None  # time.monotonic() when pooled (idle), else None
    try:
        if init_fn is not None:
            init_fn(wid)
        while True:
            if not conn.poll(_POLL_S if idle is None else min(_POLL_S, _IDLE_S / 4)):
                if os.getppid() != parent:
                    return
                if idle is not None and time.monotonic() - idle > _IDLE_S:
                    return  # unused in the pool for long enough
                continue
            try:
                msg = pickle.loads(conn.recv_bytes())
            except EOFError:
                return
            if msg is None:
                return
            if msg[0] == "idle":
                # Back in the pool: let go of the ring (the loader that owns
                # it may close; a mapping would pin its memory).
                ring = base = None
                lo = hi = 0
                idle = time.monotonic()
                continue
            if msg[0] == "start":
                # Taken from the pool by a new iteration: reseed as a new
                # worker would be, and say so.
                idle = None
                seed = msg[1]
                random.seed(seed)
                torch.manual_seed(seed)
                _worker_info = WorkerInfo(wid, num_workers, seed)
                try:
                    tw._worker_info = tw.WorkerInfo(id=wid, num_workers=num_workers, seed=seed, dataset=None)
                except Exception:
                    pass
                conn.send_bytes(pickle.dumps("ready"))
                continue
            if msg[0] == "ring":
                fd = multiprocessing.reduction.recv_handle(conn)
                import mmap

                try:
                    ring = mmap.mmap(fd, msg[1], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                base = np.frombuffer(ring, np.uint8)
                lo = base.__array_interface__["data"][0]
                hi = lo + len(ring)
                continue
            # A chunk: consecutive batches, answered with one message of
            # their results in order (one hand-off each way per chunk).
            results = []
            for _, slot_off, slot_size, n, epoch, step, padded, grid, body in msg[1]:
                try:
                    meta = np.frombuffer(bytearray(body), "<i8")
                    buf = np.frombuffer(ring, np.uint8, slot_size, slot_off)
                    out = transform(Batch(meta[:n], epoch, step, padded, meta[n:].reshape(n, 2), buf, None, grid,
                                          decode))
                    try:
                        results.append(_fast_encode(out, lo, hi))
                    except _Slow:
                        f = io.BytesIO()
                        f.write(b"o")
                        _Pickler(f, lo, hi).dump(out)
                        results.append(f.getvalue())
                    del out, buf
                except Exception:
                    from torch._utils import ExceptionWrapper

                    w = ExceptionWrapper(where=f"in ffkit.torch.DataLoader worker {wid}")
                    results.append(b"e" + pickle.dumps(w))
            conn.send_bytes(pickle.dumps(results, pickle.HIGHEST_PROTOCOL))
    finally:
        conn.close()


class DataLoader:
    """Batches of an FFRecord dataset with the transform run in worker
    processes, in the order of ``num_workers=0`` for any number of workers.

    The main process reads (one ``ffkit.Loader``: the engine's batched
    parallel reads land in its shared ring) and sends batch k to worker
    ``(k // c) mod num_workers`` (chunks of ``c = prefetch_factor // 2``
    consecutive batches, one message each way per chunk) as slot numbers
    and sample positions; the worker
    maps the same ring (its memfd is passed once over the worker's socket),
    runs ``transform(batch)`` on views of it, and sends the result back.
    Tensors and arrays of the result that view the batch come back as views
    of the main process's ring (no copy; the slot stays lent while they
    live), so the default transform (``to_tensors``) costs no copy at all;
    other results go by value (small) or through PyTorch's shared memory.

    Args:
        dataset: an ``ffkit.torch.Dataset`` (its path, shuffle, seed, ranks,
            transform and loader options are used), or a path (then the
            keyword arguments below and ``**loader_options`` of
            ``ffkit.Loader`` apply).
        batch_size: samples per batch (default: the Dataset's).
        num_workers: worker processes running the transform (0: in this
            process).
        transform: called with each ``ffkit.loader.Batch`` in a worker;
            default the Dataset's, else ``to_tensors``. Keep no views of a
            batch past the call (copy what you keep). ``to_tensors`` itself
            runs in this process (it only makes views: a worker would add a
            round trip and nothing else), so with it no worker starts.
        prefetch_factor: batches in flight per worker. They go to the
            worker in chunks of ``prefetch_factor // 2`` consecutive
            batches, answered with one message: one hand-off each way per
            chunk rather than per batch. Default: as many as fit in
            _INFLIGHT_BYTES (16 MiB) per worker, between 2 and 16, from
            the mean sample size of the dataset's local files (4 when that
            is not known): small batches go in long chunks, large ones do
            not take more ring memory than they need.
        persistent_workers: keep the workers between epochs. Without it
            (and at close) the idle workers go to a pool, and the next
            iteration or DataLoader with the same transform, decode and
            worker_init_fn (pickled to the same bytes), start method and
            worker count reuses them, reseeded, instead of forking (see
            _IDLE_S; FFKIT_TORCH_POOL=0 turns that off).
        worker_init_fn: called with the worker id in each worker first.
        multiprocessing_context: a context or start method name (default
            torch.multiprocessing's); with "spawn" or "forkserver" the
            transform must be picklable.
        timeout: seconds to wait for a worker's result (0: no limit).

    Iterating runs the current epoch (the next iteration runs the next one;
    ``set_epoch`` picks one). ``state_dict()`` is the position after the
    last batch this DataLoader yielded (batches in flight in the workers
    are not counted), and ``load_state_dict`` resumes there, with any
    number of workers; the state is the same as ``Dataset.state_dict()``'s.
    """

    def __init__(self, dataset, batch_size=None, num_workers=0, *, shuffle=True, seed=0, rank=None, world_size=None,
                 drop_last=False, transform=None, prefetch_factor=None, persistent_workers=False, worker_init_fn=None,
                 multiprocessing_context=None, timeout=0, **loader_options):
        if isinstance(dataset, Dataset):
            path, shuffle, seed = dataset.path, dataset.shuffle, dataset.seed
            rank, world_size, drop_last = dataset.rank, dataset.world_size, dataset.drop_last
            batch_size = batch_size or dataset.batch_size
            transform = transform or dataset.transform
            loader_options = {**dataset.loader_options, **loader_options}
            state = dataset.state_dict()
        else:
            path, state = dataset, None
            if batch_size is None:
                raise errors.UsageError("ffkit.torch.DataLoader: batch_size is required with a path")
        self.num_workers = int(num_workers)
        if prefetch_factor is None:
            prefetch_factor = _default_prefetch(path, int(batch_size))
        self.prefetch_factor = max(1, int(prefetch_factor or 1))
        if self.num_workers < 0:
            raise errors.UsageError(f"ffkit.torch.DataLoader: num_workers must be >= 0, got {num_workers}")
        self.batch_size = int(batch_size)
        self.transform = transform or to_tensors
        self.persistent_workers = bool(persistent_workers)
        self.worker_init_fn = worker_init_fn
        self.timeout = float(timeout or 0)
        ctx = multiprocessing_context
        if ctx is None:
            ctx = torch.multiprocessing.get_context()
        elif isinstance(ctx, str):
            ctx = torch.multiprocessing.get_context(ctx)
        self._ctx = ctx
        self._decode = loader_options.get("decode")
        # The ring must hold the batches in flight in the workers besides
        # those the caller holds.
        self._inflight = self.num_workers * self.prefetch_factor
        if self.num_workers == 0 or self.transform is to_tensors:
            # Read and made here (see __iter__): no worker holds slots, and
            # every extra slot costs its first touch (page faults, zeroed
            # pages) when the engine first fills it.
            self._inflight = 0
        self._chunk = max(1, self.prefetch_factor // 2)
        hold = int(loader_options.pop("hold", 2))
        self._loader = Loader(path, self.batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                              drop_last=drop_last, hold=hold + self._inflight, **loader_options)
        self._workers = []  # [process, connection, ring generation it has, poller, outbox, results]
        self._rewind = False  # an iteration stopped with batches in flight
        self._busy = False  # an iteration has batches in flight in the workers
        self._key = False  # the pool key, once computed (None: not pooled)
        if state is not None and (state.get("loader") is not None or state.get("epoch")):
            self.load_state_dict(state)
        self._state = self._loader.state_dict()

    def __len__(self):
        """Batches per epoch on this rank."""
        return len(self._loader)

    @property
    def epoch(self):
        return self._loader.epoch

    def set_epoch(self, epoch):
        """Makes the next iteration run epoch ``epoch`` from its start."""
        self._loader.set_epoch(epoch)
        self._state = self._loader.state_dict()
        self._rewind = False

    def state_dict(self):
        """Where this DataLoader stands after the last batch it yielded."""
        return {"loader": dict(self._state), "epoch": self._state["epoch"]}

    def load_state_dict(self, state):
        """Resumes at a state_dict of this DataLoader or of a Dataset (any
        number of workers, ranks or batch size; refused for other data)."""
        inner = state.get("loader")
        if inner is None:
            self._loader.set_epoch(state.get("epoch", 0))
        else:
            self._loader.load_state_dict(inner)
        self._state = self._loader.state_dict()
        self._rewind = False

    def __iter__(self):
        if self._rewind:
            # The last iteration stopped with batches in flight: the loader
            # is past them, so go back to the last batch yielded.
            self._loader.load_state_dict(self._state)
            self._rewind = False
        if self.num_workers == 0 or self.transform is to_tensors:
            # The default transform only makes views of the ring: a worker
            # would add a round trip and nothing else.
            return self._iter_here()
        return self._iter_workers()

    def _iter_here(self):
        L = self._loader
        for b in L:
            out = self.transform(b)
            self._state = L.state_dict()
            del b
            yield out

    # -- workers -----------------------------------------------------------

    def _pool_key(self):
        """The key under which this DataLoader's workers can be pooled and
        reused, or None (see _IDLE_S)."""
        if self._key is False:
            try:
                code = pickle.dumps((self.transform, self._decode, self.worker_init_fn), pickle.HIGHEST_PROTOCOL)
            except Exception:
                code = None  # a lambda, a closure: forked workers only
            method = self._ctx.get_start_method() if hasattr(self._ctx, "get_start_method") else None
            self._key = None
            if code is not None and len(code) <= _POOL_KEY_MAX and method is not None and _POOL_ON:
                self._key = (method, self.num_workers, code)
        return self._key

    def _wake(self, workers, seed):
        """Reseeds pooled workers for this DataLoader; False if one of them
        is gone (it exited by itself, idle for too long)."""
        self._workers = workers
        try:
            for w, (p, conn, *_) in enumerate(workers):
                conn.send_bytes(pickle.dumps(("start", seed + w)))
                workers[w][2] = None  # it has no ring
            for w in range(len(workers)):
                if pickle.loads(self._wait(w)) != "ready":
                    raise errors.EngineError("ffkit.torch.DataLoader: a pooled worker answered out of turn")
            return True
        except (OSError, ValueError, errors.EngineError):
            self._workers = []
            _stop(workers)
            return False

    def _start_workers(self):
        if self._workers:
            return
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        key = self._pool_key()
        if key is not None:
            ws = _pool_take(key)
            if ws is not None and self._wake(ws, seed):
                return
        try:
            for w in range(self.num_workers):
                parent, child = self._ctx.Pipe(duplex=True)
                p = self._ctx.Process(
                    target=_worker_loop,
                    args=(w, self.num_workers, child, self.transform, self._decode, seed + w, self.worker_init_fn,
                          os.getpid()),
                    daemon=True,
                )
                try:
                    p.start()
                finally:
                    child.close()
                poller = select.poll()
                poller.register(parent.fileno(), select.POLLIN)
                poller.register(p.sentinel, select.POLLIN)
                self._workers.append([p, parent, None, poller, [], collections.deque()])
        except BaseException:
            self._stop_workers()
            raise

    def _stop_workers(self):
        workers, self._workers = self._workers, []
        _stop(workers)

    def _release_workers(self):
        """Hands idle workers (nothing in flight) to the pool for the next
        DataLoader or iteration with the same transform; stops them if they
        cannot be pooled."""
        workers, self._workers = self._workers, []
        if not workers:
            return
        key = self._pool_key()
        if key is not None and not sys.is_finalizing():
            try:
                for p, conn, *_ in workers:
                    conn.send_bytes(pickle.dumps(("idle",)))
                if _pool_put(key, workers):
                    return
            except (OSError, ValueError):
                pass
        _stop(workers)

    def _send(self, w, b, ring_base):
        """Queues batch b for worker w (sent by _flush)."""
        L = self._loader
        p, conn, gen, _, outbox, _ = self._workers[w]
        slot_off = b._buf.__array_interface__["data"][0] - ring_base
        body = np.concatenate((b.indices, b.positions.reshape(-1))).tobytes()
        try:
            if gen != L._gen:
                self._flush(w)  # its batches name the ring it has
                conn.send_bytes(pickle.dumps(("ring", len(L._ring))))
                multiprocessing.reduction.send_handle(conn, L._ring_fd, p.pid)
                self._workers[w][2] = L._gen
        except OSError:
            pass  # the worker is gone: see _flush
        outbox.append((slot_off, len(b._buf), len(b), b.epoch, b.step, b.padded, b._grid, body))
        return slot_off

    def _flush(self, w):
        """Sends worker w its queued batches as one chunk."""
        _, conn, _, _, outbox, _ = self._workers[w]
        if not outbox:
            return
        chunk = [("b",) + x for x in outbox]
        outbox.clear()
        try:
            conn.send_bytes(pickle.dumps(("c", chunk), pickle.HIGHEST_PROTOCOL))
        except OSError:
            # The worker is gone (a broken pipe). The batches before these
            # are still yielded in order: _wait raises, naming the worker's
            # exit code, when the first of these results is due.
            pass

    def _wait(self, w):
        """The next message of worker w (raises if the worker died or the
        timeout passed)."""
        p, conn, _, poller, _, _ = self._workers[w]
        waited = 0.0
        fd = conn.fileno()
        while True:
            step = _POLL_S if not self.timeout else min(_POLL_S, self.timeout - waited)
            ready = poller.poll(step * 1000)
            if any(r == fd for r, _ in ready):
                try:
                    return conn.recv_bytes()
                except (EOFError, OSError):
                    pass  # the worker is gone: say how below
            if ready or not p.is_alive():
                p.join(timeout=60)  # it is exiting: wait for its exit code
                raise errors.EngineError(
                    f"ffkit.torch.DataLoader: worker {w} (pid {p.pid}) exited unexpectedly "
                    f"(exit code {p.exitcode})")
            waited += step
            if self.timeout and waited >= self.timeout:
                raise errors.EngineError(
                    f"ffkit.torch.DataLoader: timed out after {self.timeout} s waiting for worker {w}")

    def _ready(self, w):
        """Whether worker w's next result can be taken without waiting
        (or its death be seen)."""
        p, conn, _, _, outbox, results = self._workers[w]
        if results:
            return True
        if outbox:
            return False  # its next result is in a chunk not sent yet
        try:
            return conn.poll(0)
        except (OSError, ValueError):
            return True  # gone: _wait says how

    def _next(self, w):
        """Worker w's next result (one of the chunk it answered last)."""
        results = self._workers[w][5]
        if not results:
            results.extend(pickle.loads(self._wait(w)))
        return results.popleft()

    def _result(self, w, b, slot_off):
        data = self._next(w)
        if type(data) is tuple:
            slot = _Slot(b._buf, slot_off)
            out, views = _fast_decode(data, slot), slot.views
        else:
            if data[:1] == b"e":
                pickle.loads(memoryview(data)[1:]).reraise()
            out, views = _unpickle_result(data, b._buf, slot_off)
        if not views:
            b.release()  # nothing views the slot: give it back now
        return out

    def _iter_workers(self):
        L = self._loader
        self._start_workers()
        self._busy = True
        n, c = self.num_workers, self._chunk
        pending = collections.deque()  # (batch, state after it, slot offset, worker)
        ring_gen, ring_base = None, 0
        k = 0
        more = True
        it = iter(L)
        clean = False
        try:
            while True:
                # Batch k goes to worker (k // c) % n: chunks of c
                # consecutive batches, refilled a whole chunk at a time.
                # With chunks of several (small) batches, a result that is
                # ready is yielded first between chunks: the first results
                # of an epoch do not wait for the whole pipeline to fill
                # (num_workers * prefetch_factor reads). With chunks of one
                # (large) batch the pipeline is filled first: yielding
                # early there left the engine less room to read ahead, and
                # 128 KiB samples went from 0.86x to 0.55x of the loader.
                while more and (k % c or len(pending) + c <= self._inflight):
                    if c > 1 and not k % c and pending and self._ready(pending[0][3]):
                        break
                    b = next(it, None)
                    if b is None:
                        more = False
                        break
                    if L._gen != ring_gen:
                        ring_gen = L._gen
                        ring_base = np.frombuffer(L._ring, np.uint8, 1).__array_interface__["data"][0]
                    w = (k // c) % n
                    k += 1
                    pending.append((b, L.state_dict(), self._send(w, b, ring_base), w))
                    del b
                    if k % c == 0:
                        self._flush(w)
                for w in range(n):
                    self._flush(w)  # a chunk cut short (the end, or no room)
                if not pending:
                    break
                b, state, slot_off, w = pending.popleft()
                out = self._result(w, b, slot_off)
                self._state = state
                del b
                yield out
                del out
            clean = True
        finally:
            if not clean:
                # Stopped early (an error, or the caller left): the loader
                # is past the batches not yielded; the next iteration goes
                # back to the last one yielded.
                self._rewind = True
            if pending:
                clean = self._drain(pending)
            if not clean:
                self._stop_workers()
            elif not self.persistent_workers:
                self._release_workers()
            self._busy = False

    def _drain(self, pending):
        """Takes (and drops) the results still due from the workers, so that
        they can serve the next iteration; False if that failed."""
        try:
            for w in range(len(self._workers)):
                self._flush(w)
            while pending:
                b, _, _, w = pending.popleft()
                self._next(w)
                b.release()
            return True
        except BaseException:
            pending.clear()
            return False

    def close(self):
        """Gives the workers back to the pool (or stops them) and closes the
        loader."""
        if self._busy:
            self._stop_workers()  # an iteration left with work in flight
        else:
            self._release_workers()
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._workers:
                if self._busy:
                    self._stop_workers()
                else:
                    self._release_workers()
        except Exception:
            pass
