"""Hostile inputs and interrupted runs (issue 11): nothing escapes, nothing explodes, nothing is half-written.

Every check runs `qcc` in a subprocess as a user would, measuring the child's own peak RSS with
wait4 or capping its address space with RLIMIT_AS, and inspects the filesystem around it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest

from qcc.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
MB = 1024 * 1024


# ----------------------------------------------------------------------------- running qcc
@attrs.frozen
class Run:
    returncode: int
    stdout: str
    stderr: str
    maxrss_mb: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def _cap(address_space: int | None) -> Callable[[], None]:
    """The child as a user starts qcc from a terminal: SIGINT at its default even when the suite
    itself runs as a background job (which starts with SIGINT ignored), and the memory cap."""

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return prepare


# A forked child's ru_maxrss starts at the parent's RSS (the kernel keeps the pre-exec high-water
# mark), and pytest holds torch & co.; so the child reports its own VmHWM, which exec resets.
_PEAK_TRAMPOLINE = """
import atexit, runpy, sys
import qcc.cli  # before qcc's entry function, a ^C is Python's own (a traceback, killed by SIGINT), as for any console script
open(sys.argv[1] + '.started', 'w').close()  # qcc's own start-up begins: parsing, importing numpy/onnx
def _peak(path=sys.argv[1]):
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            open(path, 'w').write(line.split()[1])
atexit.register(_peak)
sys.argv = ['qcc', *sys.argv[2:]]
runpy.run_module('qcc', run_name='__main__')
"""


def start(args: Sequence[str | Path], cwd: Path = ROOT, env: dict[str, str] | None = None,
          address_space: int | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    logs = Path(tempfile.mkdtemp(prefix="qcc-run-"))
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", _PEAK_TRAMPOLINE, str(logs / "hwm"), *map(str, args)],
                                stdout=out, stderr=err, cwd=cwd, env={**os.environ, **(env or {})},
                                preexec_fn=_cap(address_space))
    return proc, logs


def finish(proc: subprocess.Popen[bytes], logs: Path, timeout: float = 600) -> Run:
    """Reap the child with wait4, so its own peak RSS is known (not the max over all children)."""
    deadline = time.monotonic() + timeout
    maxrss = 0
    while proc.returncode is None:  # Popen.send_signal polls first: a child that ended just before is reaped there
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode, maxrss = os.waitstatus_to_exitcode(status), usage.ru_maxrss
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"qcc did not finish in {timeout}s")
        time.sleep(0.02)
    hwm = logs / "hwm"
    peak_kb = float(hwm.read_text()) if hwm.exists() and hwm.read_text().strip() else maxrss
    run = Run(proc.returncode, (logs / "out").read_text(errors="replace"), (logs / "err").read_text(errors="replace"),
              peak_kb / 1024)
    shutil.rmtree(logs, ignore_errors=True)
    return run


def run_qcc(*args: str | Path, **kwargs: object) -> Run:
    return finish(*start(args, **kwargs))  # type: ignore[arg-type]


def run_all(commands: Sequence[Sequence[str | Path]], cwd: Path = ROOT, address_space: int | None = None) -> list[Run]:
    """Independent runs side by side (the machine has cores to spare while each imports)."""
    started = [start(args, cwd=cwd, address_space=address_space) for args in commands]
    return [finish(proc, logs) for proc, logs in started]


def one_error(run: Run, code: int, path: Path | str) -> str:
    """The run failed with `code`, in one `qcc: ...` line naming `path`, and without a traceback."""
    lines = [line for line in run.error_lines if "[nnabla]" not in line]
    assert run.returncode == code, run.stderr
    assert len(lines) == 1 and lines[0].startswith("qcc: "), run.stderr
    assert str(path) in lines[0], lines[0]
    assert "Traceback" not in run.stderr
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `root` with its size and mtime."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            stat = path.lstat()
            out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return out


# ----------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def digits_nnp(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    import qcc.driver

    out = tmp_path_factory.mktemp("nnp") / "digits.nnp"
    qcc.driver.compile(DIGITS / "digits_cnn.onnx", out, target="nnp")
    return out.read_bytes()


def with_members(archive: bytes, extra: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        for name, data in extra.items():
            zout.writestr(name, data)
    return out.getvalue()


def declared_bomb(archive: bytes, name: str, declared: int) -> bytes:
    """A member holding 1 KiB whose central directory entry declares `declared` bytes (zip64)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        zout.writestr(name, bytes(1024))
        zout.getinfo(name).file_size = declared  # written into the central directory on close
    return out.getvalue()


def deflated_bomb(archive: bytes, name: str, head: bytes, total: int) -> bytes:
    """A real, valid member that inflates to `total` bytes (`head` then zeros) from about total/1000.

    The deflate stream is one 16 MiB full-flush block repeated, so building 2 GiB takes a second.
    """
    chunk = 16 * MB
    assert total % chunk == 0 and len(head) < chunk
    first_chunk = head + bytes(chunk - len(head))
    pieces = []
    for data in (first_chunk, bytes(chunk)):
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        pieces.append(c.compress(data) + c.flush(zlib.Z_FULL_FLUSH))
    stream = pieces[0] + pieces[1] * (total // chunk - 1) + b"\x03\x00"  # an empty final block
    crc = zlib.crc32(first_chunk)
    zeros = bytes(chunk)
    for _ in range(total // chunk - 1):
        crc = zlib.crc32(zeros, crc)
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as zin, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        member = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        zout.writestr(member, stream, compress_type=zipfile.ZIP_STORED)
        info = zout.getinfo(name)
        info.compress_type, info.file_size, info.CRC = zipfile.ZIP_DEFLATED, total, crc
        offset = info.header_offset
    raw = bytearray(buffer.getvalue())
    raw[offset + 8:offset + 10] = zipfile.ZIP_DEFLATED.to_bytes(2, "little")  # local header: method, crc, size
    raw[offset + 14:offset + 18] = crc.to_bytes(4, "little")
    raw[offset + 22:offset + 26] = total.to_bytes(4, "little")
    return bytes(raw)


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape})
    header += " " * ((-(len(header) + 11)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def test_deflated_bomb_helper_builds_a_real_bomb() -> None:
    """The bomb below is genuine: zipfile inflates it to its full size when asked to."""
    bomb = deflated_bomb(_empty_zip(), "x.npy", npy_header((64 * MB // 4,)), 64 * MB)
    assert len(bomb) < 200_000
    with zipfile.ZipFile(io.BytesIO(bomb)) as zf:
        data = zf.read("x.npy")
    assert len(data) == 64 * MB and data.startswith(b"\x93NUMPY") and not any(data[4096:])


def _empty_zip() -> bytes:
    out = io.BytesIO()
    zipfile.ZipFile(out, "w").close()
    return out.getvalue()


# ----------------------------------------------------------------------------- zip slip
def test_zip_slip_nnp_writes_nothing_outside_its_directory(tmp_path: Path, digits_nnp: bytes) -> None:
    outer = tmp_path / "outer"
    work = outer / "a" / "b" / "work"
    work.mkdir(parents=True)
    targets = [work.parent / "slip1", outer / "slip3", tmp_path / "slip4", outer / "absolute"]
    members = {"../slip1": b"owned", "../../../slip3": b"owned", "../../../../slip4": b"owned",
               str(outer / "absolute"): b"owned", "ok/../../slip_norm": b"owned"}
    commands: list[list[str | Path]] = []
    for n, (name, data) in enumerate(members.items()):
        evil = work / f"evil{n}.nnp"
        evil.write_bytes(with_members(digits_nnp, {name: data}))
        commands += [["inspect", evil], ["compile", evil, "-o", work / f"out{n}.onnx"]]
    before_outer, before_parent = tree(outer), sorted(os.listdir(tmp_path.parent))
    for args, run in zip(commands, run_all(commands, cwd=work)):
        line = one_error(run, 3, args[1])
        assert "absolute path" in line or "climbs out" in line
    assert tree(outer) == before_outer  # nothing written or touched anywhere around the archives
    assert sorted(os.listdir(tmp_path.parent)) == before_parent
    assert not any(t.exists() for t in targets)


# ----------------------------------------------------------------------------- zip bombs
def _bomb_cases(digits_nnp: bytes, tmp: Path) -> list[tuple[str, Path, list[str | Path]]]:
    cases: list[tuple[str, Path, list[str | Path]]] = []
    for kind, data in (
        ("nnp-declared-10GB", declared_bomb(digits_nnp, "parameter2.protobuf", 10 * 1024**3)),
        ("nnp-deflated-2GB", deflated_bomb(digits_nnp, "parameter2.protobuf", b"", 2 * 1024**3)),
        ("npz-declared-10GB", declared_bomb(_empty_zip(), "x.npy", 10 * 1024**3)),
        ("npz-deflated-2GB", deflated_bomb(_empty_zip(), "x.npy", npy_header((2 * 1024**3 // 256, 1, 8, 8)),
                                           2 * 1024**3)),
    ):
        path = tmp / f"{kind}.{kind[:3]}"
        path.write_bytes(data)
        if kind.startswith("nnp"):
            cases.append((kind, path, ["inspect", path]))
        else:
            cases.append((kind, path, ["compile", DIGITS / "digits_cnn.onnx", "-o", tmp / "q.onnx", "--target",
                                       "onnx-qdq", "--quantize", "int8", "--calib", path]))
    return cases


def test_zip_bombs_are_refused_with_bounded_memory(tmp_path: Path, digits_nnp: bytes) -> None:
    cases = _bomb_cases(digits_nnp, tmp_path)
    for (kind, path, _), run in zip(cases, run_all([args for _, _, args in cases])):
        assert path.stat().st_size < 5 * MB
        line = one_error(run, 3, path)
        assert "limit" in line, line
        assert run.maxrss_mb < 400, f"{kind}: peak RSS {run.maxrss_mb:.0f} MB"
        assert not (tmp_path / "q.onnx").exists()
    good = run_qcc("compile", DIGITS / "digits_cnn.onnx", "-o", tmp_path / "q.onnx", "--target", "onnx-qdq",
               "--quantize", "int8", "--calib", DIGITS / "calib.npz")
    assert good.returncode == 0, good.stderr


# ----------------------------------------------------------------------------- huge declared tensors
def _onnx_bytes(edit: Callable[..., None]) -> bytes:
    import onnx

    model = onnx.load(str(DIGITS / "digits_cnn.onnx"))
    edit(model, onnx)
    return bytes(model.SerializeToString())


def _huge_initializer(model: object, onnx: object) -> None:
    tensor = model.graph.initializer[0]  # type: ignore[attr-defined]
    del tensor.dims[:]
    tensor.dims.extend([10**6, 10**6])


def _huge_input(model: object, onnx: object) -> None:
    dims = model.graph.input[0].type.tensor_type.shape.dim  # type: ignore[attr-defined]
    dims[1].dim_value = 10**12


def _huge_constant_of_shape(model: object, onnx: object) -> None:
    helper = onnx.helper  # type: ignore[attr-defined]
    graph = model.graph  # type: ignore[attr-defined]
    shape = helper.make_tensor("s", onnx.TensorProto.INT64, [2], [10**6, 10**6])  # type: ignore[attr-defined]
    graph.node.insert(0, helper.make_node("ConstantOfShape", ["big_shape"], ["big"]))
    graph.node.insert(0, helper.make_node("Constant", [], ["big_shape"], value=shape))


def test_a_declared_huge_tensor_is_refused_before_allocating(tmp_path: Path, digits_nnp: bytes) -> None:
    """10^12 elements (4 TB) under a 2 GiB address-space cap: refused by the limits, not by MemoryError."""
    text = zipfile.ZipFile(io.BytesIO(digits_nnp)).read("network.nntxt").decode()
    declared = re.search(r"shape \{\s*dim: -1\s*dim: 1\s", text)  # the input x: (-1, 1, 8, 8)
    assert declared is not None
    nntxt = text.replace(declared.group(0), declared.group(0).replace("dim: 1", "dim: 1000000000000"), 1)
    nnp_out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(digits_nnp)) as zin, zipfile.ZipFile(nnp_out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, nntxt if info.filename == "network.nntxt" else zin.read(info))
    npz_out = io.BytesIO()
    with zipfile.ZipFile(npz_out, "w") as zf:
        zf.writestr("x.npy", npy_header((10**12, 1, 8, 8)) + bytes(4096))
    files = {
        "initializer.onnx": _onnx_bytes(_huge_initializer),
        "input.onnx": _onnx_bytes(_huge_input),
        "constant_of_shape.onnx": _onnx_bytes(_huge_constant_of_shape),
        "variable.nnp": nnp_out.getvalue(),
        "array.npz": npz_out.getvalue(),
    }
    commands: list[list[str | Path]] = []
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        if name.endswith(".npz"):
            commands.append(["compile", DIGITS / "digits_cnn.onnx", "-o", tmp_path / "q.onnx", "--target", "onnx-qdq",
                             "--quantize", "int8", "--calib", path])
        else:
            commands.append(["compile", path, "-o", tmp_path / f"{name}.out.onnx"])
    for name, run in zip(files, run_all(commands, address_space=2 * 1024**3)):
        line = one_error(run, 3, tmp_path / name)
        assert "over the limit" in line, line
        assert run.maxrss_mb < 400


# ----------------------------------------------------------------------------- interrupted compiles
@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chain of 9 MatMul+Relu with 2048x2048 random weights: 151 MB, whose compile takes long
    enough (load, convert, export, write and fsync) to interrupt at chosen moments; a quarter of
    the bytes, and a fraction of the CPU, of the light vgg19 these tests used to compile 8 times."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    width, nodes, weights, previous = 2048, [], [], "x"
    for i in range(9):
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((width, width), dtype=np.float32) / np.float32(np.sqrt(width))), f"w{i}"))
        nodes += [helper.make_node("MatMul", [previous, f"w{i}"], [f"h{i}"], name=f"matmul{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        previous = f"r{i}"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["N", width])], weights)
    path = tmp_path_factory.mktemp("big") / "big.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


def temporaries(directory: Path, name: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(f".{name}.")]


def visible(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


def wait_for_temporary(proc: subprocess.Popen[bytes], directory: Path, name: str, timeout: float = 300) -> float:
    """Poll until the compile starts writing its output (its hidden temporary appears)."""
    start = time.monotonic()
    while not temporaries(directory, name):
        assert proc.poll() is None, "qcc finished before it was interrupted"
        assert time.monotonic() - start < timeout
        time.sleep(0.01)
    return time.monotonic()


@pytest.fixture(scope="module")
def big_timeline(big_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[float, float, str]:
    """(seconds until the output's temporary appears, total seconds, sha256 of the output)."""
    out_dir = tmp_path_factory.mktemp("ref")
    began = time.monotonic()
    proc, logs = start(["compile", big_model, "-o", out_dir / "big.onnx"])
    writing = wait_for_temporary(proc, out_dir, "big.onnx") - began
    run = finish(proc, logs)
    assert run.returncode == 0, run.stderr
    return writing, time.monotonic() - began, sha256(out_dir / "big.onnx")


TEMPORARY = re.compile(r"^\.big\.onnx\.\d+-\w+\.(tmp|old)$")  # .old: the previous file's second name


def test_sigkill_during_a_compile_leaves_the_old_file_or_none(big_model: Path, big_timeline: tuple[float, float, str],
                                                               tmp_path: Path) -> None:
    writing, total, reference = big_timeline
    out = tmp_path / "big.onnx"
    old = b"the complete output of an earlier compile"
    left_behind = 0
    # (no previous output?, when to kill: None = while compiling, else that fraction into the write)
    for fresh, during_write in ((False, None), (False, 0.3), (True, 0.5), (False, 0.85)):
        if fresh:
            out.unlink(missing_ok=True)
        else:
            out.write_bytes(old)
        proc, logs = start(["compile", big_model, "-o", out])
        if during_write is None:
            time.sleep(writing * 0.6)
        else:
            seen = wait_for_temporary(proc, tmp_path, out.name)
            time.sleep(max(0.0, (total - writing) * during_write - (time.monotonic() - seen)))
        proc.send_signal(signal.SIGKILL)
        run = finish(proc, logs)
        assert run.returncode in (-signal.SIGKILL, 0)
        if out.exists():
            assert sha256(out) == reference or (not fresh and out.read_bytes() == old)
        else:
            assert fresh
        assert visible(tmp_path) == ([out.name] if out.exists() else [])
        hidden = temporaries(tmp_path, out.name)
        assert all(TEMPORARY.match(n) for n in hidden), hidden
        left_behind = max(left_behind, len(hidden))
    assert left_behind, "no kill landed while the output was being written"
    # the next compile to the same target removes the temporaries of the killed runs
    assert run_qcc("compile", DIGITS / "digits_cnn.onnx", "-o", out).returncode == 0
    assert temporaries(tmp_path, out.name) == [] and visible(tmp_path) == [out.name]


def test_sigint_exits_130_without_partial_output(big_model: Path, big_timeline: tuple[float, float, str],
                                                 tmp_path: Path) -> None:
    writing, _, _ = big_timeline
    out = tmp_path / "big.onnx"
    for moment in ("startup", "compiling", "writing"):
        proc, logs = start(["compile", big_model, "-o", out])
        if moment == "startup":  # parsing the command line, importing numpy/onnx
            # once Python itself is up: a SIGINT inside the interpreter's own initialization is
            # Python's fatal error (exit 1) before any program runs, on a loaded machine at 0.5 s
            deadline = time.monotonic() + 60
            while not (logs / "hwm.started").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.1)
        elif moment == "compiling":
            time.sleep(writing * 0.6)
        else:  # at once: the write of 151 MB and its fsync outlast the poll; later could be after the exit
            wait_for_temporary(proc, tmp_path, out.name)
        proc.send_signal(signal.SIGINT)
        run = finish(proc, logs)
        assert run.returncode == 130, (moment, run.stderr[-2000:])
        assert run.error_lines[-1] == "qcc: interrupted" and "Traceback" not in run.stderr
        assert os.listdir(tmp_path) == [], moment  # no output, no temporary


def _import_cut_by_interrupt(*args: object) -> None:
    """What a SIGINT inside `import numpy` raises: numpy's ImportError, the KeyboardInterrupt in its chain."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise ImportError("Error importing numpy: you should not try to import numpy from its source directory") from exc


def _c_code_cut_by_interrupt(*args: object) -> None:
    """C code that a SIGINT cuts short may clear the KeyboardInterrupt and raise its own error."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        pass
    raise ValueError("invalid shape in fixed-type tuple.")


@pytest.mark.parametrize("where, cut", [("_parser", _import_cut_by_interrupt), ("_cmd_targets", _import_cut_by_interrupt),
                                        ("_cmd_targets", _c_code_cut_by_interrupt)])
def test_interrupt_inside_an_import_exits_130(where: str, cut: Callable[..., None], monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Seen on a loaded machine: ^C while numpy was imported gave exit 1 and a traceback, or exit 70."""
    import qcc.cli as cli

    monkeypatch.setattr(cli, where, cut)
    # as in a `qcc` process: Python's own ^C handler (a library an earlier test loaded may have set its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["targets"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.splitlines()[-1] == "qcc: interrupted"


def test_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    from qcc.io import atomic_directory, atomic_write_bytes

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".out.onnx.{dead.pid}-abc123.tmp"
        stale_dir = tmp_path / f".out_c.{dead.pid}-def456.tmp"
        running = tmp_path / f".out.onnx.{live.pid}-xyz789.tmp"
        other = tmp_path / f".out.onnx.x.{dead.pid}-abc123.tmp"  # belongs to target "out.onnx.x"
        for path in (stale, running, other):
            path.write_bytes(b"partial")
        stale_dir.mkdir()
        (stale_dir / "half.c").write_text("int")
        atomic_write_bytes(tmp_path / "out.onnx", b"new")
        with atomic_directory(tmp_path / "out_c") as tmp:
            (tmp / "model.c").write_text("int x;")
        assert (tmp_path / "out.onnx").read_bytes() == b"new" and (tmp_path / "out_c" / "model.c").exists()
        assert not stale.exists() and not stale_dir.exists()
        assert running.exists() and other.exists()
    finally:
        live.kill()
        live.wait()


def test_outputs_get_the_usual_permissions(tmp_path: Path) -> None:
    from qcc.io import atomic_directory, atomic_write_bytes

    mask = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "a.onnx", b"x")
        with atomic_directory(tmp_path / "c") as tmp:
            (tmp / "m.c").write_text("")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.onnx").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o755


# ----------------------------------------------------------------------------- determinism
SCHEMES = {"onnx": ("none", ".onnx"), "onnx-qdq": ("int8", ".onnx"), "nnb": ("fixed8", ".nnb"),
           "nnp": ("fixed8", ".nnp"), "c": ("fixed8", "")}

COMPILE_ALL = """
import json, sys
import qcc.driver
jobs = json.loads(sys.argv[1])
for model, calib, target, scheme, out in jobs:
    qcc.driver.compile(model, out, target=target, quantize=scheme, calib=calib if scheme != "none" else None)
"""


def test_compiles_are_byte_identical_whatever_the_hash_seed_and_clock(tmp_path: Path) -> None:
    from qcc.plugins import registry
    from tests.onnx_zoo import randomized_bytes

    backends = [b for b in SCHEMES if b in registry().names("backend")]
    assert "onnx" in backends
    squeezenet = tmp_path / "squeezenet.onnx"
    squeezenet.write_bytes(randomized_bytes("squeezenet"))
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32))
    models = {"digits": (DIGITS / "digits_cnn.onnx", DIGITS / "calib.npz"), "squeezenet": (squeezenet, calib)}
    outputs = {}
    for run, (hash_seed, zone) in enumerate((("1", "UTC0"), ("4242", "JST-9"))):
        directory = tmp_path / f"run{run}"
        directory.mkdir()
        jobs = [(str(model), str(data), backend, SCHEMES[backend][0], str(directory / f"{name}-{backend}{SCHEMES[backend][1]}"))
                for name, (model, data) in models.items() for backend in backends
                if name == "digits" or SCHEMES[backend][0] in ("none", "int8")]  # squeezenet: a graph with Concat, cheaply
        proc = subprocess.run([sys.executable, "-c", COMPILE_ALL, json.dumps(jobs)], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": hash_seed, "TZ": zone}, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[run] = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    assert len(outputs[0]) >= 2 * len(backends)
    assert outputs[0].keys() == outputs[1].keys()
    different = [name for name in outputs[0] if outputs[0][name] != outputs[1][name]]
    assert different == []


# ----------------------------------------------------------------------------- messages
def _unsupported_op(model: object, onnx: object) -> None:
    graph = model.graph  # type: ignore[attr-defined]
    graph.node.append(onnx.helper.make_node("Frobnicate", [graph.output[0].name], ["extra"], domain="com.example"))  # type: ignore[attr-defined]


def test_every_error_is_one_line_naming_the_file(tmp_path: Path, digits_nnp: bytes) -> None:
    model = DIGITS / "digits_cnn.onnx"
    onnx_bytes = model.read_bytes()
    import qcc.driver

    nnb = tmp_path / "digits.nnb"
    qcc.driver.compile(model, nnb, target="nnb")
    files = {
        "truncated.onnx": onnx_bytes[: len(onnx_bytes) // 3],
        "unsupported.onnx": _onnx_bytes(_unsupported_op),
        "slip.nnp": with_members(digits_nnp, {"../../x": b"owned"}),
        "truncated.nnb": nnb.read_bytes()[:1000],
        "pickled.npz": _npz(x=np.array([object()] * 4, dtype=object)),
        "shape.npz": _npz(x=np.zeros((4, 3, 8, 8), np.float32)),
        "bad.yaml": b"variables:\n  no_such_tensor: FIXED8_3\n",
        "binary.yaml": b"variables:\n  x: \xff\xfe\n",
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    out = tmp_path / "out.onnx"
    quantized: list[str | Path] = ["-o", tmp_path / "q.onnx", "--target", "onnx-qdq", "--quantize", "int8"]
    cases: list[tuple[list[str | Path], int, Path]] = [
        (["compile", paths["truncated.onnx"], "-o", out], 3, paths["truncated.onnx"]),
        (["inspect", paths["truncated.onnx"]], 3, paths["truncated.onnx"]),
        (["compile", paths["unsupported.onnx"], "-o", out], 4, paths["unsupported.onnx"]),
        (["inspect", paths["slip.nnp"]], 3, paths["slip.nnp"]),
        (["inspect", paths["truncated.nnb"]], 3, paths["truncated.nnb"]),
        (["compile", model, *quantized, "--calib", paths["pickled.npz"]], 3, paths["pickled.npz"]),
        (["compile", model, *quantized, "--calib", paths["shape.npz"]], 3, paths["shape.npz"]),
        (["compile", model, "-o", out, "--settings", paths["bad.yaml"]], 3, paths["bad.yaml"]),
        (["compile", model, "-o", out, "--settings", paths["binary.yaml"]], 3, paths["binary.yaml"]),
        (["compile", tmp_path / "missing.onnx", "-o", out], 2, tmp_path / "missing.onnx"),
        (["compile", model, "-o", out, "--limit", "max_nodes=5"], 3, model),
        (["compile", model, "-o", out, "--limit", "max_tensor_elements=100"], 3, model),
    ]
    for (_, code, path), run in zip(cases, run_all([args for args, _, _ in cases])):
        one_error(run, code, path)
    assert not out.exists() and not (tmp_path / "q.onnx").exists()


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def test_a_stack_trace_only_with_debug(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 50)
    plain = run_qcc("inspect", bad)
    one_error(plain, 3, bad)
    debug = run_qcc("inspect", bad, "--debug")
    assert debug.returncode == 3
    assert "Traceback (most recent call last)" in debug.stderr and "InvalidInputError" in debug.stderr
    assert debug.error_lines[-1] == plain.error_lines[0]


# ----------------------------------------------------------------------------- .pt2
def small_pt2(path: Path) -> Path:
    """A torch.export program of Linear(4, 3) then ReLU, saved at `path`."""
    torch = pytest.importorskip("torch")

    class Small(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x: object) -> object:
            return torch.relu(self.fc(x))

    torch.export.save(torch.export.export(Small().eval(), (torch.randn(2, 4),)), str(path))
    return path


def rewrite_zip(src: Path, dst: Path, edit: Callable[[str, bytes], bytes]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info, edit(info.filename, zin.read(info)))


def test_pt2_loading_runs_no_code_from_the_file(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import qcc.driver

    good = small_pt2(tmp_path / "good.pt2")
    markers = {name: tmp_path / f"executed-{name}" for name in ("inputs", "weights", "expression")}

    class Payload:
        def __init__(self, marker: Path) -> None:
            self.marker = str(marker)

        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (self.marker, "w"))  # unpickling it creates the marker file

    def pickled(marker: Path) -> bytes:
        buffer = io.BytesIO()
        torch.save(Payload(marker), buffer)
        return buffer.getvalue()

    def weights(name: str, data: bytes) -> bytes:
        if name.endswith("weights_config.json"):
            config = json.loads(data)
            config["config"]["fc.bias"]["use_pickle"] = True
            return json.dumps(config).encode()
        return pickled(markers["weights"]) if name.endswith("weights/weight_1") else data

    def expression(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        code = f"__import__('os').open('{markers['expression']}', 0o101)"
        return data.replace(b'{"as_int": 2}', json.dumps({"as_expr": {"expr_str": code, "hint": {"as_int": 2}}}).encode(), 1)

    evil = {
        "inputs": lambda n, d: pickled(markers["inputs"]) if "sample_inputs" in n else d,
        "weights": weights,
        "expression": expression,
    }
    paths = {}
    for name, edit in evil.items():
        paths[name] = tmp_path / f"{name}.pt2"
        rewrite_zip(good, paths[name], edit)
    # the files are genuinely hostile: torch.export.load on its own runs each payload
    for path in paths.values():
        with contextlib.suppress(Exception):
            torch.export.load(str(path))
    assert all(marker.exists() for marker in markers.values()), [m.name for m in markers.values() if not m.exists()]
    for marker in markers.values():
        marker.unlink()
    for name, path in paths.items():
        with pytest.raises(InvalidInputError) as info:
            qcc.driver.load(path)
        assert str(path) in str(info.value)
        assert not markers[name].exists(), name
    assert len(qcc.driver.load(good).graph.nodes) >= 2
