"""Reading HFAiLab's packed folders (``ffrecord.package.pack_folder`` output).

A packed folder is one .ffr file: sample i is file i of the folder, and the
last sample is MAGIC + a pickle of the folder's structure (nested
OrderedDicts mapping names to sample indices). The pickle is read with a
restricted unpickler that builds only dicts, OrderedDicts, lists, strings and
numbers and refuses any other class, so a crafted file cannot run code.
"""
import io
import os
import pickle
from collections import OrderedDict
from pathlib import Path, PurePosixPath

from .. import errors

MAGIC_BYTES = b"piouhjgbr"


class _RestrictedUnpickler(pickle.Unpickler):
    _ALLOWED = {("collections", "OrderedDict"): OrderedDict}

    def find_class(self, module, name):
        cls = self._ALLOWED.get((module, name))
        if cls is None:
            raise errors.CorruptError(
                f"ffrecord: packed-folder index refers to {module}.{name}; only dicts, lists, strings and ints are allowed"
            )
        return cls

    def persistent_load(self, pid):
        raise errors.CorruptError("ffrecord: packed-folder index uses persistent ids")


def load_structure(data):
    """Unpickles a packed folder's index with the restricted unpickler and
    checks its shape: names map to ints (files) or to nested dicts."""
    try:
        obj = _RestrictedUnpickler(io.BytesIO(data)).load()
    except errors.FFKitError:
        raise
    except Exception as e:
        raise errors.CorruptError(f"ffrecord: bad packed-folder index: {e}") from None

    def check(d, where):
        if not isinstance(d, dict):
            raise errors.CorruptError(f"ffrecord: packed-folder index: {where or '/'} is {type(d).__name__}, not a dict")
        for k, v in d.items():
            if not isinstance(k, str):
                raise errors.CorruptError(f"ffrecord: packed-folder index: name {k!r} under {where or '/'} is not a str")
            if isinstance(v, bool) or not isinstance(v, (int, dict)):
                raise errors.CorruptError(f"ffrecord: packed-folder index: {where}/{k} is {type(v).__name__}")
            if isinstance(v, dict):
                check(v, f"{where}/{k}")

    check(obj, "")
    return obj


class PackedFolder:
    """A folder packed into one .ffr file by the reference's ``pack_folder``."""

    def __init__(self, ffr_file, check_data=True):
        from . import FileReader

        self.reader = FileReader(ffr_file, check_data)
        if self.reader.n < 1:
            raise errors.UsageError(f"ffrecord: {ffr_file} is not a packed folder (no samples)")
        meta = self.reader.read_one(self.reader.n - 1).tobytes()
        if len(meta) <= len(MAGIC_BYTES) or meta[: len(MAGIC_BYTES)] != MAGIC_BYTES:
            raise errors.UsageError(f"ffrecord: {ffr_file} is not a packed folder")
        self.structure = load_structure(meta[len(MAGIC_BYTES):])

    def num_files(self):
        return self.reader.n - 1

    def _walk(self, path):
        struct = self.structure
        for part in Path(path).parts:
            if not isinstance(struct, dict) or part not in struct:
                raise errors.NotFoundError(f"ffrecord: {path} does not exist in the packed folder")
            struct = struct[part]
        return struct

    def _fname_to_index(self, fname):
        s = self._walk(fname)
        if not isinstance(s, int):
            raise errors.UsageError(f"ffrecord: {fname} is a directory, not a file")
        if not 0 <= s < self.reader.n - 1:
            raise errors.CorruptError(f"ffrecord: {fname} maps to sample {s}, outside the packed folder")
        return s

    def read_one(self, fname):
        return self.reader.read_one(self._fname_to_index(fname))

    def read(self, fnames):
        if not isinstance(fnames, (list, tuple)):
            raise TypeError("fnames must be a list or tuple")
        return self.reader.read([self._fname_to_index(p) for p in fnames])

    def exists(self, path):
        try:
            self._walk(path)
            return True
        except errors.NotFoundError:
            return False

    def is_file(self, path):
        return self.exists(path) and isinstance(self._walk(path), int)

    def is_dir(self, path):
        return self.exists(path) and isinstance(self._walk(path), dict)

    def list(self, path=None, list_file=True, list_dir=True, recursive=False):
        struct = self.structure if path is None else self._walk(path)
        if not isinstance(struct, dict):
            raise errors.UsageError(f"ffrecord: {path} is a file, not a directory")
        return self._list(struct, list_file, list_dir, recursive)

    def _list(self, struct, list_file, list_dir, recursive):
        out = []
        for name, child in struct.items():
            is_file = isinstance(child, int)
            if (is_file and list_file) or (not is_file and list_dir):
                out.append(name)
            if recursive and not is_file:
                out += [Path(name) / p for p in self._list(child, list_file, list_dir, recursive)]
        return out

    def close(self):
        self.reader.close()


def pack_folder(folder, out_file, verbose=False):
    """Packs a folder into one .ffr file readable by PackedFolder (and by the
    reference's PackedFolder)."""
    from . import FileWriter

    folder = Path(folder).absolute()
    if not folder.is_dir():
        raise errors.UsageError(f"ffrecord: {folder} is not a directory")
    structure = OrderedDict()
    files = []

    def walk(d, s):
        for child in sorted(d.iterdir()):
            if child.is_dir():
                s[child.name] = OrderedDict()
                walk(child, s[child.name])
            else:
                s[child.name] = len(files)
                files.append(child)

    walk(folder, structure)
    meta = MAGIC_BYTES + pickle.dumps(structure)
    with FileWriter(out_file, len(files) + 1) as w:
        for i, p in enumerate(files):
            w.write_one(p.read_bytes())
            if verbose:
                print(f"{i}/{len(files)} {p}", flush=True)
        w.write_one(meta)
