"""Exceptions raised by ffkit.

Errors from the Go engine arrive as these exceptions, carrying the engine's
message unchanged (which file, which sample, which bytes). Each class also
derives from the built-in exception a Python user would expect, so existing
``except ValueError`` / ``except OSError`` code keeps working:

- ``DataError(ValueError)``: the data is bad. Subclasses ``ChecksumError``,
  ``CorruptError``, ``TruncatedError``.
- ``UsageError(ValueError)``: a bad argument; ``IndexOutOfRange`` also derives
  from ``IndexError``; ``NoFilesError``, ``StateError``, ``OptionsError``,
  ``BudgetError``, ``BadRequestError``, ``ProtocolError``.
- ``UnavailableError(OSError)``: a file or service could not be reached;
  ``NotFoundError`` also derives from ``FileNotFoundError``,
  ``PermissionDeniedError`` from ``PermissionError``; ``NoSpaceError``.
- ``EngineError(RuntimeError)``: the helper process failed.

Every error code the engine sends (``_protocol.ERROR_CODES``, generated from
the engine's schema) has its class here; a test checks that none is missing.
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


class NoFilesError(UsageError):
    """A path names no .ffr files."""

    code = "no_files"


class StateError(UsageError):
    """A loader state that does not fit this loader or dataset."""

    code = "state"


class OptionsError(UsageError):
    """Loader options out of range."""

    code = "options"


class BudgetError(UsageError):
    """A memory budget too small for one batch."""

    code = "budget"


class BadRequestError(UsageError):
    """The engine refused a request (unknown operation, handle or field)."""

    code = "bad_request"


class ProtocolError(UsageError):
    """A frame that does not follow the engine protocol."""

    code = "protocol"


class UnavailableError(FFKitError, OSError):
    kind = "unavailable"


class NotFoundError(UnavailableError, FileNotFoundError):
    code = "not_found"


class PermissionDeniedError(UnavailableError, PermissionError):
    code = "permission"


class NoSpaceError(UnavailableError):
    code = "no_space"


class EngineError(FFKitError, RuntimeError):
    """The engine helper process died or broke the protocol."""


# "canceled" is not here: it becomes KeyboardInterrupt (see from_reply).
_BY_CODE = {
    "checksum": ChecksumError,
    "corrupt": CorruptError,
    "truncated": TruncatedError,
    "short_read": TruncatedError,
    "index": IndexOutOfRange,
    "no_files": NoFilesError,
    "state": StateError,
    "options": OptionsError,
    "budget": BudgetError,
    "bad_request": BadRequestError,
    "protocol": ProtocolError,
    "not_found": NotFoundError,
    "permission": PermissionDeniedError,
    "no_space": NoSpaceError,
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
