"""What a compile may write, decided before any work is done (docs/errors.md, "Outputs").

- A file output (.onnx, .nnb, .nnp, the report) replaces a regular file of that name; never a
  directory or a special file (a FIFO, a device).
- A directory output (target c) replaces only a directory qcc wrote (it holds the `MARKER`
  file), an empty directory, or nothing. A directory holding other files, a regular file or a
  symbolic link is the user's: refused unless `--force`. A special file is never replaced.
- No output may be one of the run's inputs, or a directory holding one (replacing a directory
  deletes what it holds, even with `--force`); no two outputs may share a path; the files a
  directory target writes must have distinct names (`-o out/main --target c` would write the
  driver's `main.c` over the model's).
- The folder each output goes into must take new files (write permission, not a read-only file
  system), so such a folder fails before the model is even loaded.
- A run that fails after its output was written (a report that cannot be written, an
  interrupt) removes the output it wrote (`OutputPlan.writing`): a failed run leaves nothing.

`qcc.io.atomic_directory` asks `check_replaceable` before it replaces anything, so the rule
holds for `qcc.write` and plugins as well as for the driver.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from qcc.errors import OutputError, UsageError

MARKER = ".qcc-output"
MARKER_TEXT = "This directory was written by qcc; the next compile to it replaces it whole.\n"

_FORCED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("qcc_forced_outputs", default=frozenset())
_KEPT: contextvars.ContextVar[list[tuple[Path, Path]] | None] = contextvars.ContextVar("qcc_kept_outputs",
                                                                                       default=None)


def keeping_replaced() -> bool:
    """Whether a writer should hand what it replaces to `keep_replaced` (inside `OutputPlan.writing`)."""
    return _KEPT.get() is not None


def keep_replaced(target: Path, old: Path) -> bool:
    """Inside `OutputPlan.writing`, what an output replaced (moved or linked to `old`) is kept until
    the run ends: put back if the run fails, deleted if it succeeds. False outside: delete it now."""
    kept = _KEPT.get()
    if kept is None:
        return False
    kept.append((target, old))
    return True


def _key(path: str | os.PathLike[str]) -> str:
    """One spelling per location: absolute, symlinks of the parent resolved, the last name kept."""
    absolute = os.path.abspath(os.fspath(path))
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise UsageError(f"{path}: a folder on this path is an existing file, not a directory") from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot inspect the output path: {exc.strerror}") from None


# ----------------------------------------------------------------------------- directory outputs
def replace_problem(target: str | os.PathLike[str]) -> tuple[str, bool] | None:
    """Why a directory output may not replace what is at `target` now, and whether --force may.

    None when it may: nothing there, an empty directory, or a directory qcc wrote.
    """
    path = Path(target)
    info = _lstat(path)
    if info is None:
        return None
    if stat.S_ISDIR(info.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise OutputError(f"{path}: cannot list the output directory: {exc.strerror}") from None
        marker = path / MARKER
        if not names or (MARKER in names and marker.is_file() and not marker.is_symlink()):
            return None
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return f"is a directory holding files qcc did not write ({shown})", True
    if stat.S_ISREG(info.st_mode):
        return "is an existing file, not a directory qcc wrote", True
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link, not a directory qcc wrote", True
    return "is a special file (a device, FIFO or socket)", False


def check_replaceable(target: str | os.PathLike[str]) -> None:
    """Raise UsageError unless a directory output may replace what is at `target` (see module doc)."""
    problem = replace_problem(target)
    if problem is None:
        return
    reason, forcible = problem
    if forcible and _key(target) in _FORCED.get():
        return
    hint = "; choose another path, empty it, or add --force" if forcible else "; choose another path"
    raise UsageError(f"{os.fspath(target)}: the output {reason}: a directory output replaces only a directory "
                     f"qcc wrote or an empty one{hint}")


def write_marker(directory: Path) -> None:
    (directory / MARKER).write_text(MARKER_TEXT)


@contextlib.contextmanager
def forcing(paths: Iterable[str | os.PathLike[str]]) -> Iterator[None]:
    """Inside the block, `check_replaceable` lets these targets replace what they find (--force)."""
    token = _FORCED.set(_FORCED.get() | {_key(p) for p in paths})
    try:
        yield
    finally:
        _FORCED.reset(token)


# ----------------------------------------------------------------------------- file outputs
def check_file_target(target: str | os.PathLike[str], what: str = "output") -> None:
    """A file output may replace a regular file or a symbolic link, nothing else."""
    path = Path(target)
    info = _lstat(path)
    if info is None or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
        return
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path}: the {what} is an existing directory; it is written as a file (give a file name, "
                         "or --target c for a directory)" if what == "output" else
                         f"{path}: the {what} is an existing directory; it is written as a file")
    raise UsageError(f"{path}: the {what} is a special file (a device, FIFO or socket); give a regular file name")


def check_writable_folder(target: str | os.PathLike[str], what: str = "output") -> None:
    """The folder `target` goes into (or the nearest one that exists) takes new files.

    Asked of the system, not tried: a refused compile must not touch the folder (not even its
    modification time). Root passes `os.access` everywhere; a folder that refuses root anyway
    (sysfs) fails at the write, still as an OutputError that leaves nothing behind.
    """
    path = Path(os.path.abspath(os.fspath(target)))
    folder = path.parent
    while _lstat(folder) is None and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{path}: cannot write the {what}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write the {what} into {folder}: permission denied")
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    if read_only:
        raise OutputError(f"{path}: cannot write the {what} into {folder}: read-only file system")


# ----------------------------------------------------------------------------- the whole run
def _same(a: str, b: str) -> bool:
    if _key(a) == _key(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: str, directory: str) -> bool:
    root = os.path.realpath(directory)
    here = os.path.realpath(path)
    return here != root and os.path.commonpath([root, here]) == root


def _collisions(outputs: dict[str, str], directories: set[str], inputs: dict[str, str], replaced: set[str]) -> None:
    named = list(outputs.items())
    for i, (what, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if _same(path, other_path) or (other in directories and _inside(path, other_path)) or \
                    (what in directories and _inside(other_path, path)):
                raise UsageError(f"{path}: the {what} and the {other} ({other_path}) would overwrite each other")
        for source, source_path in inputs.items():
            if _same(path, source_path):
                raise UsageError(f"{path}: the {what} is the {source}; writing it would destroy the input")
            if what in replaced and _inside(source_path, path):
                raise UsageError(f"{path}: the {what} directory holds the {source} ({source_path}); replacing the "
                                 "directory would delete it")


def check_generated_names(target: str, names: Iterable[str]) -> None:
    """The files a directory target writes, as the file system will see them: no two alike."""
    seen: dict[str, str] = {}
    for name in names:
        folded = name.casefold()  # macOS and Windows file systems ignore case
        if folded in seen:
            raise UsageError(f"{target}: the target would write two files named {name!r}, one over the other; "
                             "choose another output name")
        seen[folded] = name


@attrs.frozen
class OutputPlan:
    """The checked outputs of one run; `writing()` guards the part of the run that writes them."""

    output: str
    directory: bool
    report: str | None = None
    force: bool = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Outputs written inside are removed again if the block fails, and what they replaced is
        put back (a failed run, an --eval of the written file included, changes nothing)."""
        paths = [p for p in (self.output, self.report) if p]
        before = {p: _identity(p) for p in paths}
        kept: list[tuple[Path, Path]] = []
        token = _KEPT.set(kept)
        try:
            with forcing([self.output] if self.force else []):
                yield
        except BaseException:
            for path in paths:
                now = _identity(path)
                if now is not None and now != before[path]:
                    _remove(Path(path))
            for target, old in reversed(kept):
                if _identity(str(target)) is None:
                    with contextlib.suppress(OSError):
                        os.replace(old, target)
            raise
        finally:
            _KEPT.reset(token)
            for _, old in kept:
                _remove(old)


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns


def _remove(path: Path) -> None:
    import shutil

    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def check_outputs(output: str | os.PathLike[str], backend: Any, inputs: dict[str, Any],
                  report: str | os.PathLike[str] | None = None, dump_ir: str | os.PathLike[str] | None = None,
                  force: bool = False, target_options: Any = None,
                  plots: str | os.PathLike[str] | None = None) -> OutputPlan:
    """Every check on what the run will write, before any work (see module doc).

    `inputs` names the run's input files by role ({"model": path, "calibration data": path, ...};
    None or in-memory models are skipped). A directory target may list the files it will write
    (`file_names(out, target_options)`) to have their names checked against each other. The IR
    dump and plot directories take new files beside what they hold; only the output directory is
    replaced whole.
    """
    out = os.fspath(output)
    directory = bool(getattr(backend, "output_is_directory", False))
    if directory:
        with forcing([out] if force else []):
            check_replaceable(out)
        names = getattr(backend, "file_names", None)
        if names is not None:
            check_generated_names(out, names(out, target_options))
    else:
        if force:  # issue 16: a flag that would have no effect is refused, not ignored
            raise UsageError(f"{out}: --force lets a directory output (target c) replace a directory qcc did not "
                             "write; a file output replaces a regular file of its name without it")
        check_file_target(out)
    outputs = {"output": out}
    if report is not None:
        outputs["report"] = os.fspath(report)
        check_file_target(outputs["report"], "report")
    folders = {"IR dump directory": ("--dump-ir", dump_ir), "plots directory": ("--plots", plots)}
    for what, (flag, folder) in folders.items():
        if folder is None:
            continue
        outputs[what] = os.fspath(folder)
        if _lstat(Path(outputs[what])) is not None and not os.path.isdir(outputs[what]):
            raise UsageError(f"{outputs[what]}: {flag} needs a directory; this is an existing file")
    sources = {role: os.fspath(path) for role, path in inputs.items() if isinstance(path, (str, os.PathLike))}
    replaced = {"output"} if directory else set()
    _collisions(outputs, set(folders) | replaced, sources, replaced)
    for what, path in outputs.items():
        check_writable_folder(path if what not in folders else os.path.join(path, "x"), what)
    return OutputPlan(out, directory, outputs.get("report"), force)
