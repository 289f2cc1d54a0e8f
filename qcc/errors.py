"""One error hierarchy for the whole compiler, so the driver can map each kind to an exit code.

Exit codes (documented in docs/errors.md): usage 2, invalid input 3, unsupported 4,
internal 70, output not writable 74. Every message names the file and, where there is one, the node/op/tensor.
"""

from __future__ import annotations

import struct
import zipfile
import zlib


class QccError(Exception):
    """Base of every error qcc raises on purpose. Its text is always one line: libraries (YAML,
    protobuf, torch) put context on lines of their own, and the message quotes them."""

    exit_code = 1
    kind = "error"

    def __str__(self) -> str:
        return one_line(super().__str__())


class UsageError(QccError):
    """The command line or API call itself is wrong (unknown pass, bad option value)."""

    exit_code = 2
    kind = "usage error"


class InvalidInputError(QccError):
    """An input file or data set is malformed, corrupt, inconsistent or over a resource limit."""

    exit_code = 3
    kind = "invalid input"


class CycleError(InvalidInputError):
    """The graph has a cycle (no topological order exists)."""


class UnsupportedError(QccError):
    """The input is valid but uses something qcc (or the chosen target) cannot handle."""

    exit_code = 4
    kind = "unsupported"


class OutputError(QccError):
    """An output cannot be written: a read-only folder, a full disk, a path that cannot be created.

    Not a bug (70) and not the command line's fault (2): the environment refused the write.
    """

    exit_code = 74  # sysexits' EX_IOERR
    kind = "cannot write"


class InternalError(QccError):
    """A bug in qcc or in a plugin: an invariant broke (e.g. a pass produced invalid IR)."""

    exit_code = 70
    kind = "internal error"


class VerificationError(InternalError):
    """The IR verifier found problems; all of them are listed, not just the first."""

    def __init__(self, problems: list[str], where: str = "") -> None:
        self.problems = list(problems)
        self.where = where
        head = f"{where}: " if where else ""
        shown = "; ".join(problems[:20])
        more = f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""
        super().__init__(f"{head}IR verification failed with {len(problems)} problem(s): {shown}{more}")


# What corrupt bytes raise inside decoders qcc calls (zip, zlib, struct, text decoding, deep
# nesting). The model loader turns these into InvalidInputError naming the file; any other
# exception escaping a reader is a bug and is reported as an internal error.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError, UnicodeError, RecursionError,
)

# What malformed content (an attribute of the wrong type or length, a missing field) raises inside
# one importer step; the ONNX and NNabla frontends turn it into an error naming the node.
MALFORMED_ERRORS: tuple[type[BaseException], ...] = (
    TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError, UnicodeError,
)


def one_line(text: str) -> str:
    """A message as one line: libraries (YAML, protobuf) put context on lines of their own."""
    return " ".join(text.split())


def naming(exc: QccError, source: str, *others: str) -> QccError:
    """`exc`, its message prefixed with `source: ` unless it already names `source` or one of `others`.

    Readers and ops deep inside qcc know the node or tensor but not always the file; the driver
    adds it here, so every message a user sees names the file it is about.
    """
    text = str(exc)
    if not any(name and name in text for name in (source, *others)):
        exc.args = (f"{source}: {text}", *exc.args[1:])
    return exc
