"""ffkit: FFRecord datasets and a zero-copy training data loader for Python.

Everything runs on ffkit's Go I/O engine, which lives in a helper process
(the Go runtime does not survive fork(), so it is never loaded into Python);
samples land in shared memory that numpy views without copying.

- ``ffkit.ffrecord``: a drop-in for HFAiLab's ``ffrecord`` (FileReader,
  FileWriter, PackedFolder; ``ffkit.ffrecord.torch``; ``ffkit.ffrecord.utils``).
- ``ffkit.Loader``: shuffled, rank-sharded, resumable batches as numpy views.
- ``ffkit.torch``: PyTorch integration (imports torch; ``import ffkit`` does not).
- ``ffkit.pack``: pack a directory, JSON Lines, tar, WebDataset, Parquet or
  Arrow source into FFRecord; ``ffkit.decode_webdataset`` splits a packed
  WebDataset sample into ``{ext: bytes}`` without copying.
- ``ffkit.scan``: Parquet scans (filter, project, aggregate, SQL) into a
  pyarrow Table mapped from shared memory (needs pyarrow).
- ``ffkit.session()``: SmallPond's DataFrame (lazy multi-stage jobs, local
  or on Ray; needs pyarrow, and ray for ``executor="ray"``).
"""
from . import errors
from .errors import ChecksumError, DataError, FFKitError

__version__ = "0.1.0"

from ._scan import scan  # noqa: E402  (light: imports the engine on first call)
from ._frame import DataFrame, Session, session  # noqa: E402  (light: stdlib only until used)


def pack(src, out, **options):
    """Packs a source into FFRecord (see ``ffkit._pack.pack``)."""
    from ._pack import pack as _pack

    return _pack(src, out, **options)


def decode_webdataset(sample):
    """Splits a packed WebDataset sample (see ``ffkit._pack.decode_webdataset``)."""
    from ._pack import decode_webdataset as _decode

    return _decode(sample)


def __getattr__(name):
    # Lazy, so that `import ffkit` stays light and never imports torch.
    if name == "Loader":
        from .loader import Loader

        return Loader
    if name in ("ffrecord",):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ffkit' has no attribute {name!r}")


__all__ = ["Loader", "scan", "session", "Session", "DataFrame", "pack", "decode_webdataset", "errors", "ffrecord", "FFKitError", "DataError", "ChecksumError"]
