"""``dump``: write an indexable dataset to FFRecord files (as the reference)."""
import os
import pickle
import threading
import warnings
from pathlib import Path

from . import FileWriter

__all__ = ["dump"]


def _item_bytes(item):
    if isinstance(item, (bytes, bytearray, memoryview)):
        return item
    try:
        memoryview(item)
        return item  # any buffer (numpy arrays included): its bytes
    except TypeError:
        return pickle.dumps(item)


def _write(i0, ni, dataset, fname, verbose, errors):
    try:
        with FileWriter(fname, ni) as w:
            for i in range(i0, i0 + ni):
                w.write_one(_item_bytes(dataset[i]))
                if verbose and (i - i0) % 1000 == 0:
                    print(f"{fname}: {i - i0}/{ni}", flush=True)
    except BaseException as e:  # reported by dump
        errors.append(e)


def dump(dataset, fname, nfiles, verbose=False):
    """Writes ``dataset`` (supports ``len`` and ``[]``) to one file
    (nfiles=1) or to ``nfiles`` files PART_00000.ffr... in folder ``fname``.
    Items that are bytes-like are stored as they are, anything else pickled.
    Files are written in parallel threads (the engine does the I/O)."""
    n = len(dataset)
    nfiles = int(nfiles)
    if nfiles < 1:
        raise ValueError(f"nfiles must be >= 1, got {nfiles}")
    errors = []
    if nfiles == 1:
        _write(0, n, dataset, os.fspath(fname), verbose, errors)
        if errors:
            raise errors[0]
        return
    out = Path(fname)
    out.mkdir(parents=True, exist_ok=True)
    bs = max(1, (n + nfiles - 1) // nfiles)
    tasks = [(i0, min(bs, n - i0), out / f"PART_{k:05d}.ffr") for k, i0 in enumerate(range(0, n, bs))]
    if len(tasks) != nfiles:
        warnings.warn(f"Split into {len(tasks)} files rather than {nfiles} files")
    threads = [threading.Thread(target=_write, args=(i0, ni, dataset, str(p), verbose, errors)) for i0, ni, p in tasks]
    for t in threads[:16]:
        t.start()
    for i, t in enumerate(threads):
        t.join()
        if i + 16 < len(threads):
            threads[i + 16].start()
    if errors:
        raise errors[0]
