"""ffkit: FFRecord datasets and a zero-copy training data loader for Python.

Everything runs on ffkit's Go I/O engine, which lives in a helper process
(the Go runtime does not survive fork(), so it is never loaded into Python);
samples land in shared memory that numpy views without copying.

- ``ffkit.ffrecord``: a drop-in for HFAiLab's ``ffrecord`` (FileReader,
  FileWriter, PackedFolder; ``ffkit.ffrecord.torch``; ``ffkit.ffrecord.utils``).
- ``ffkit.Loader``: shuffled, rank-sharded, resumable batches as numpy views.
- ``ffkit.torch``: PyTorch integration (imports torch; ``import ffkit`` does not).
- ``ffkit.scan``: Parquet scans (filter, project, aggregate, SQL) into a
  pyarrow Table mapped from shared memory (needs pyarrow).
"""
from . import errors
from .errors import ChecksumError, DataError, FFKitError

__version__ = "0.1.0"

from ._scan import scan  # noqa: E402  (light: imports the engine on first call)


def __getattr__(name):
    # Lazy, so that `import ffkit` stays light and never imports torch.
    if name == "Loader":
        from .loader import Loader

        return Loader
    if name in ("ffrecord",):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ffkit' has no attribute {name!r}")


__all__ = ["Loader", "scan", "errors", "ffrecord", "FFKitError", "DataError", "ChecksumError"]
