"""Exceptions raised by ffkit.

Errors from the Go engine arrive as these exceptions, carrying the engine's
message unchanged (which file, which sample, which bytes). Each class also
derives from the built-in exception a Python user would expect, so existing
``except ValueError`` / ``except OSError`` code keeps working:

- ``DataError(ValueError)``: the data is bad. Subclasses ``ChecksumError``,
  ``CorruptError``, ``TruncatedError``.
- ``UsageError(ValueError)``: a bad argument; ``IndexOutOfRange`` also derives
  from ``IndexError``.
- ``UnavailableError(OSError)``: a file or service could not be reached;
  ``NotFoundError`` also derives from ``FileNotFoundError``.
- ``EngineError(RuntimeError)``: the helper process failed.
"""


class FFKitError(Exception):
    """Base class of every ffkit error. ``kind`` and ``code`` classify it."""

    kind = "other"
    code = ""

    def __init__(self, message, kind=None, code=None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        if code is not None:
            self.code = code


class DataError(FFKitError, ValueError):
    kind = "data"


class ChecksumError(DataError):
    code = "checksum"


class CorruptError(DataError):
    code = "corrupt"


class TruncatedError(DataError):
    code = "truncated"


class UsageError(FFKitError, ValueError):
    kind = "usage"


class IndexOutOfRange(UsageError, IndexError):
    code = "index"


class UnavailableError(FFKitError, OSError):
    kind = "unavailable"


class NotFoundError(UnavailableError, FileNotFoundError):
    code = "not_found"


class EngineError(FFKitError, RuntimeError):
    """The engine helper process died or broke the protocol."""


_BY_CODE = {
    "checksum": ChecksumError,
    "corrupt": CorruptError,
    "truncated": TruncatedError,
    "short_read": TruncatedError,
    "index": IndexOutOfRange,
    "not_found": NotFoundError,
}
_BY_KIND = {"data": DataError, "usage": UsageError, "unavailable": UnavailableError}


def from_reply(header):
    """Turns an engine error reply into the matching exception."""
    msg = header.get("error", "unknown error")
    kind = header.get("kind") or "other"
    code = header.get("code") or ""
    if code == "canceled":
        return KeyboardInterrupt(msg)
    cls = _BY_CODE.get(code) or _BY_KIND.get(kind) or FFKitError
    return cls(msg, kind=kind, code=code)
