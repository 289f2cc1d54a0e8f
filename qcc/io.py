"""Atomic output: write beside the target, then rename, so a crash leaves the old file or none.

Temporaries are hidden siblings named `.<target>.<pid>-<random>.tmp` (`.old` for what is being
replaced, kept until the run's writing block ends: `qcc.outputs.OutputPlan.writing`). A compile killed with SIGKILL cannot remove its own; the next write to the
same target removes those whose process is gone (or whose pid now belongs to a process started
after them), so leftovers never pile up and a concurrent writer's temporaries are never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}-"


def _temporary_beside(target: Path) -> Path:
    """The name of a new temporary beside `target` (its folder made, dead writers' leftovers
    removed). Chosen before it exists: the caller creates it inside the block that removes it on
    failure (^C included), so no interrupt can leave it behind."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(target)
    except OSError as exc:
        raise _cannot_write(target, exc) from None
    return target.parent / f"{_prefix(target)}{os.urandom(6).hex()}.tmp"


def _started_at(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), None if it does not exist or is unknown."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: alive
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0  # alive, start unknown: treat its temporaries as live


def clean_stale_temporaries(target: str | os.PathLike[str]) -> list[Path]:
    """Remove temporaries of `target` left by writers that no longer run; returns what was removed."""
    path = Path(target)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)-[A-Za-z0-9_]+\.(tmp|old)$")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        started = _started_at(int(match.group(1)))
        try:
            stale = started is None or entry.stat(follow_symlinks=False).st_mtime < started - 1
        except OSError:
            continue
        if not stale:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _cannot_write(target: Path, exc: OSError) -> Exception:
    from qcc.errors import OutputError

    return OutputError(f"{target}: cannot write: {exc.strerror or exc}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through a temporary beside it; never over a directory or special file.

    What the file system refuses (a read-only folder, a full disk) is an OutputError naming the
    target, and leaves neither the temporary nor a partial target behind.
    """
    from qcc.outputs import check_file_target

    target = Path(path)
    check_file_target(target)
    tmp = _temporary_beside(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # created 0600; `open` would give 0666 & ~umask
            os.fsync(handle.fileno())
        _keep_previous(target)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _cannot_write(target, exc) from None
        raise
    _fsync_directory(target.parent)


def _keep_previous(target: Path) -> None:
    """Inside a run's writing block, a second name (a hard link: no copy) for the file about to be
    replaced, so a run that fails later can put it back (`qcc.outputs.OutputPlan.writing`)."""
    from qcc.outputs import keep_replaced, keeping_replaced

    if not keeping_replaced() or not stat.S_ISREG(_lstat_mode(target)):
        return
    old = target.parent / f"{_prefix(target)}{os.urandom(4).hex()}.old"
    try:
        os.link(target, old)
    except OSError:  # a file system without hard links: the file is replaced without a way back
        return
    keep_replaced(target, old)


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` whole.

    Only what `qcc.outputs.check_replaceable` allows is replaced (a directory qcc wrote, an empty
    one, or what --force names); the new directory carries qcc's marker file.
    """
    from qcc.outputs import check_replaceable, keep_replaced, write_marker

    target = Path(path)
    check_replaceable(target)
    tmp = _temporary_beside(target)
    try:
        os.mkdir(tmp, 0o700)
        yield tmp
        write_marker(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        if os.path.lexists(target):
            old = Path(tempfile.mkdtemp(prefix=_prefix(target), suffix=".old", dir=target.parent))
            os.rmdir(old)
            os.replace(target, old)
            os.replace(tmp, target)
            if keep_replaced(target, old):  # a run's writing block puts it back if the run fails
                pass
            elif old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(old)
        else:
            os.replace(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _cannot_write(target, exc) from None
        raise
    _fsync_directory(target.parent)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence C/C++ libraries (protobuf) that log parse errors straight to fd 2.

    qcc reports the failure itself in one line; the native log would add noise to it.
    """
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, what: str = "file",
                      offset: int = 0, length: int | None = None) -> bytes:
    """The bytes of a regular file, never more than `max_bytes`.

    Opened non-blocking (a FIFO cannot hang the open) and checked with fstat on the open handle,
    so a symlink to /dev/zero, a device, a FIFO or a directory is refused, not read until memory
    runs out. The limit applies to what is read, not only to st_size, so a file that grows while
    it is read cannot exceed it either.
    """
    from qcc.errors import InvalidInputError

    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InvalidInputError(f"{name}: cannot read {what}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInputError(f"{name}: {what} is not a regular file (a device, FIFO, socket or directory)")
        want = info.st_size - offset if length is None else length
        if offset < 0 or want < 0 or offset + want > info.st_size:
            raise InvalidInputError(f"{name}: {what}: bytes {offset}..{offset + want} lie outside the file "
                                    f"({info.st_size} bytes)")
        if want > max_bytes:
            raise InvalidInputError(f"{name}: {what} of {want} bytes is over the {max_bytes}-byte limit")
        os.lseek(fd, offset, os.SEEK_SET)
        # one read fills one buffer (a regular file gives all it has, up to 2 GiB): reading in
        # chunks and joining them would need twice the file's size at the peak
        chunks = [os.read(fd, want)]
        got = len(chunks[0])
        while got < want:
            chunk = os.read(fd, want - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got != want:
            raise InvalidInputError(f"{name}: {what} ended after {got} of {want} bytes")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def require_regular_file(path: str | os.PathLike[str], what: str = "file") -> int:
    """Refuse a path that is not a regular file (after symlinks) before anything opens it; its size.

    For readers that open the path themselves (zipfile, h5py): a FIFO would block their open and
    a device would be read without end.
    """
    from qcc.errors import InvalidInputError

    name = os.fspath(path)
    try:
        info = os.stat(name)
    except OSError as exc:
        raise InvalidInputError(f"{name}: cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInputError(f"{name}: {what} is not a regular file (a device, FIFO, socket or directory)")
    return info.st_size
