"""Zip archives (.nnp, .npz, .pt2) read without trusting them.

Everything is decided from the central directory before a single member is inflated: member
count, names (no absolute or `..` paths, no NULs, no duplicates), the declared uncompressed total,
the compression ratio of each large member and of all small members together (a zip bomb deflates at ~1000:1; real weights, data and
text stay far below `max_compression_ratio`). A member is then read with at most its declared
size (zipfile stops there), so a header that lies cannot inflate past the caps. Nothing is ever
extracted to disk.
"""

from __future__ import annotations

import contextlib
import posixpath
import zipfile
import zlib
from collections.abc import Iterator

from qcc import limits
from qcc.errors import InvalidInputError

RATIO_FLOOR = 16 * 1024 * 1024  # members smaller than this may compress as well as they like

# what corrupt archive bytes raise inside zipfile/zlib (RuntimeError: an encrypted member;
# ValueError/OverflowError: nonsense header fields)
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, RuntimeError, ValueError,
              OverflowError, NotImplementedError)


@contextlib.contextmanager
def reading(source: str, kind: str) -> Iterator[None]:
    """Turn zipfile/zlib failures inside the block into one InvalidInputError naming the file."""
    try:
        yield
    except InvalidInputError:
        raise
    except ZIP_ERRORS as exc:
        raise InvalidInputError(f"{source}: corrupt {kind} archive: {type(exc).__name__}: {str(exc)[:200]}") from None


def check_member_name(name: str, source: str) -> None:
    if not name or "\x00" in name:
        raise InvalidInputError(f"{source}: archive member with an empty or NUL-containing name")
    normal = name.replace("\\", "/")
    if normal.startswith("/") or (len(normal) > 1 and normal[1] == ":"):
        raise InvalidInputError(f"{source}: archive member {name!r} has an absolute path; refusing the archive")
    if ".." in normal.split("/") or ".." in posixpath.normpath(normal).split("/"):
        raise InvalidInputError(f"{source}: archive member {name!r} climbs out of the archive with '..'; "
                                "refusing the archive")


def checked_members(archive: zipfile.ZipFile, source: str, max_bytes: int | None = None) -> list[zipfile.ZipInfo]:
    """The archive's members after every check that needs no inflating (see module doc)."""
    lim = limits.current()
    infos = archive.infolist()
    if len(infos) > lim.max_archive_members:
        raise InvalidInputError(f"{source}: archive has {len(infos)} members, over the limit of "
                                f"{lim.max_archive_members} (--limit max_archive_members=N)")
    seen: set[str] = set()
    total = small_declared = small_compressed = 0
    for info in infos:
        check_member_name(info.filename, source)
        if info.filename in seen:
            raise InvalidInputError(f"{source}: archive member {info.filename!r} appears twice")
        seen.add(info.filename)
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > RATIO_FLOOR and ratio > lim.max_compression_ratio:
            raise InvalidInputError(
                f"{source}: archive member {info.filename!r} would inflate {info.compress_size} bytes to "
                f"{info.file_size} (ratio {ratio:.0f}, over the limit of {lim.max_compression_ratio}): a zip bomb? "
                "(--limit max_compression_ratio=N)")
        if info.file_size <= RATIO_FLOOR:
            small_declared += info.file_size
            small_compressed += info.compress_size
    # many members each just under the floor add up: the floor applies to their sum too
    ratio = small_declared / max(small_compressed, 1)
    if small_declared > RATIO_FLOOR and ratio > lim.max_compression_ratio:
        raise InvalidInputError(
            f"{source}: archive members under {RATIO_FLOOR} bytes each would inflate {small_compressed} bytes to "
            f"{small_declared} together (ratio {ratio:.0f}, over the limit of {lim.max_compression_ratio}): a zip "
            "bomb? (--limit max_compression_ratio=N)")
    cap = max_bytes or lim.max_archive_bytes
    if total > cap:
        raise InvalidInputError(f"{source}: archive would expand to {total} bytes, over the limit of {cap} "
                                "(--limit max_archive_bytes=N); refusing it")
    return infos


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: str) -> bytes:
    """A member's bytes: never more than its declared size, which must also be what it holds."""
    with archive.open(info) as handle:
        data = handle.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise InvalidInputError(f"{source}: member {info.filename!r} does not hold the {info.file_size} bytes "
                                "its header declares")
    return data
