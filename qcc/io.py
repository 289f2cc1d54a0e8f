"""Atomic output: write beside the target, then rename, so a crash leaves the old file or none.

Temporaries are hidden siblings named `.<target>.<pid>-<random>.tmp` (`.old` for a directory
being replaced). A compile killed with SIGKILL cannot remove its own; the next write to the
same target removes those whose process is gone (or whose pid now belongs to a process started
after them), so leftovers never pile up and a concurrent writer's temporaries are never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}-"


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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 is not what `open` gives
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(target.parent)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` whole."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(target), suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=_prefix(target), suffix=".old", dir=target.parent))
            os.rmdir(old)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
