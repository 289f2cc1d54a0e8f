"""Issue 20, high and medium: what `qcc compile` may write, and what it does when it cannot.

Every case runs the `qcc` command as a user would and looks at the file system around it: a
user's directory or file is never replaced unless `--force`, an output never lands on an input,
on another output or on a special file, the C target's files never overwrite one another, the
refusals come before any work (usage error, exit 2), and a folder or disk that refuses the
write is a one-line "cannot write" error (exit 74) that leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

import qcc
from qcc.errors import UsageError
from tests.cli_util import DIGITS, ROOT
from tests.test_hardening import one_error, run_all, run_qcc

MODEL = DIGITS / "digits_cnn.onnx"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (links as their target) with its content hash."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture()
def user(tmp_path: Path) -> Path:
    """A user's working folder: notes in a directory, a plain file, the model and its data."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("the user's notes\n")
    (tmp_path / "plain").write_text("a file without an extension\n")
    (tmp_path / "work").mkdir()
    shutil.copy(MODEL, tmp_path / "work" / "model.onnx")
    shutil.copy(DIGITS / "calib.npz", tmp_path / "work" / "calib.npz")
    return tmp_path


def test_a_users_directory_or_file_is_not_replaced_without_force(user: Path) -> None:
    model = user / "work" / "model.onnx"
    before = snapshot(user)
    runs = run_all([["compile", model, "-o", user / "notes"], ["compile", model, "-o", user / "plain", "--target", "c"]])
    for run, path in zip(runs, (user / "notes", user / "plain")):
        line = one_error(run, 2, path)
        assert "--force" in line, line
    assert snapshot(user) == before


def test_force_replaces_it_and_the_directory_is_marked_as_qcc_s_own(user: Path) -> None:
    model = user / "work" / "model.onnx"
    forced = run_qcc("compile", model, "-o", user / "notes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (user / "notes" / "todo.txt").exists()
    assert (user / "notes" / ".qcc-output").is_file() and (user / "notes" / "notes.c").is_file()
    again = run_qcc("compile", model, "-o", user / "notes")  # qcc's own directory: replaced without --force
    assert again.returncode == 0, again.stderr
    api = qcc.compile(model, user / "plain", target="c", force=True)
    assert api[0] is not None and (user / "plain" / "plain.c").is_file()


def test_outputs_never_land_on_inputs_other_outputs_or_special_files(user: Path) -> None:
    work = user / "work"
    model, calib = work / "model.onnx", work / "calib.npz"
    os.mkfifo(user / "fifo")
    (user / "main").mkdir()
    before = snapshot(user)
    cases: list[tuple[Path, dict[str, object], Path, str]] = [
        (model, {}, model, "is the model"),
        (work, {"force": True}, work, "holds the model"),  # even --force keeps inputs
        (calib, {"target": "onnx", "eval": str(calib)}, calib, "evaluation data"),
        (user / "out.onnx", {"report": str(model)}, model, "is the model"),
        (user / "out.onnx", {"report": str(user / "out.onnx")}, user / "out.onnx", "each other"),
        (user / "main", {"target": "c"}, user / "main", "two files named 'main.c'"),
        (user / "fifo", {"target": "onnx"}, user / "fifo", "special file"),
        (user / "notes", {"target": "onnx"}, user / "notes", "existing directory"),
        (user / "out.onnx", {"report": str(user / "notes")}, user / "notes", "existing directory"),
        (user / "out.onnx", {"dump_ir": str(user / "plain")}, user / "plain", "needs a directory"),
        (user / "out.onnx", {"eval": str(calib), "plots": str(user / "plain")}, user / "plain", "needs a directory"),
        (user / "out.onnx", {"eval": str(calib), "plots": str(user / "out.onnx")}, user / "out.onnx", "each other"),
        (user / "out.onnx", {"force": True}, user / "out.onnx", "a file output replaces"),  # --force would do nothing
        (user / "plain" / "x.onnx", {}, user / "plain" / "x.onnx", "not a directory"),
    ]
    for out, options, path, needle in cases:
        with pytest.raises(UsageError) as info:
            qcc.compile(model, out, **options)  # type: ignore[arg-type]
        assert str(path) in str(info.value) and needle in str(info.value), (out, options, str(info.value))
    assert snapshot(user) == before  # nothing written, nothing lost
    # the command line says the same in one line, exit 2
    one_error(run_qcc("compile", model, "-o", model), 2, model)


def test_a_folder_that_refuses_files_is_a_cannot_write_error_before_any_work(tmp_path: Path) -> None:
    # /proc/sys refuses new files to everyone, root included, and says so to os.access: refused up
    # front; /sys says yes to root and refuses the file itself: refused at the write, same error
    runs = run_all([["compile", MODEL, "-o", "/proc/sys/qcc-test.onnx"], ["compile", MODEL, "-o", "/sys/qcc-test.onnx"]])
    first = one_error(runs[0], 74, "/proc/sys/qcc-test.onnx")
    assert first.startswith("qcc: cannot write: /proc/sys/qcc-test.onnx: cannot write the output into"), first
    assert one_error(runs[1], 74, "/sys/qcc-test.onnx").startswith("qcc: cannot write:")
    assert not os.path.exists("/sys/qcc-test.onnx") and not os.path.exists("/proc/sys/qcc-test.onnx")


def _limited_qcc(args: list[str | Path], file_size: int) -> subprocess.CompletedProcess[str]:
    """qcc with files capped at `file_size` bytes: a write past it fails as on a full disk (EFBIG)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return subprocess.run([sys.executable, "-m", "qcc", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          preexec_fn=cap, timeout=600, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_a_full_disk_is_a_cannot_write_error_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "digits.onnx"
    proc = _limited_qcc(["compile", MODEL, "-o", out], 16 * 1024)  # the model is 76 KB
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 74, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"qcc: cannot write: {out}"), proc.stderr
    assert os.listdir(tmp_path) == []  # no output, no temporary


def _chain(path: Path, n: int) -> Path:
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"], name=f"relu{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, [1, 8])])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


def test_a_run_that_fails_after_writing_its_output_removes_it(tmp_path: Path) -> None:
    """The report (one entry per tensor) is larger than the model: the disk fills on the report."""
    model = _chain(tmp_path / "chain.onnx", 300)
    out, report = tmp_path / "out" / "chain.onnx", tmp_path / "out" / "report.json"
    (tmp_path / "out").mkdir()
    full = run_qcc("compile", model, "-o", tmp_path / "sizes.onnx", "--report", tmp_path / "sizes.json")
    assert full.returncode == 0, full.stderr
    limit = (tmp_path / "sizes.onnx").stat().st_size + 1024
    assert (tmp_path / "sizes.json").stat().st_size > limit
    proc = _limited_qcc(["compile", model, "-o", out, "--report", report], limit)
    assert proc.returncode == 74 and f"qcc: cannot write: {report}" in proc.stderr, proc.stderr
    assert os.listdir(tmp_path / "out") == []  # the model it had written is gone too


def test_the_c_target_refuses_colliding_file_names_from_python_too(tmp_path: Path) -> None:
    model = qcc.load(MODEL)
    with pytest.raises(UsageError, match=r"two files named 'main\.c'"):
        qcc.write(model, tmp_path / "build", target="c", name="Main")
    assert not (tmp_path / "build").exists()


def test_a_directory_output_holds_the_marker_beside_the_sources(tmp_path: Path) -> None:
    out = tmp_path / "digits"
    qcc.compile(MODEL, out, target="c")
    assert sorted(p.name for p in out.iterdir()) == [".qcc-output", "Makefile", "digits.c", "digits.h", "main.c"]
    assert "written by qcc" in (out / ".qcc-output").read_text()


def test_qcc_run_eval_and_settings_never_write_over_their_inputs(user: Path) -> None:
    """The commands of issue 16 that write files follow the same rule as compile, before any work."""
    work = user / "work"
    model, data = work / "model.onnx", work / "calib.npz"
    nnp = work / "model.nnp"
    qcc.compile(model, nnp)
    before = snapshot(user)
    runs = run_all([["run", model, data, "-o", data], ["run", model, data, "-o", model],
                    ["eval", model, data, "--report", data], ["eval", model, data, "--reference", nnp, "--report", nnp],
                    ["settings", nnp, "-o", nnp], ["settings", nnp, "--calib", data, "-o", data]])
    for run, (path, role) in zip(runs, [(data, "data file"), (model, "model"), (data, "data file"), (nnp, "reference"),
                                        (nnp, "model"), (data, "calibration data")]):
        line = one_error(run, 2, path)
        assert f"is the {role}; writing it would destroy the input" in line, line
    assert snapshot(user) == before


@pytest.mark.parametrize("out", ["out.onnx", "out_c"])
def test_an_eval_that_fails_on_the_written_file_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                out: str) -> None:
    """--eval runs the written file in its runtime: a failure there is a failed run, which removes
    what it wrote and puts back what the outputs replaced (an earlier compile's file or directory)."""
    import qcc.evaluation
    from qcc.errors import InvalidInputError

    def broken_runtime(*args: object, **kwargs: object) -> None:
        assert (tmp_path / out).exists() and not (tmp_path / out / "old.c").exists()  # it runs what was written
        raise InvalidInputError("the runtime refused the written file")

    qcc.compile(MODEL, tmp_path / "first" / out)
    shutil.move(tmp_path / "first" / out, tmp_path / out)  # an earlier compile's output (c: qcc's directory)
    if out == "out_c":
        (tmp_path / out / "old.c").write_text("int old;\n")
    (tmp_path / "r.json").write_text("{}\n")
    before = snapshot(tmp_path)
    monkeypatch.setattr(qcc.evaluation, "eval_written", broken_runtime)
    with pytest.raises(InvalidInputError, match="runtime refused"):
        qcc.compile(MODEL, tmp_path / out, eval=str(DIGITS / "test.npz"), report=str(tmp_path / "r.json"))
    assert snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == sorted(["first", out, "r.json"])  # nothing hidden left either


def test_eval_runs_an_nnp_written_under_another_extension(tmp_path: Path) -> None:
    """Found by the campaign (`-o user/notes.txt --target nnp --eval ...`): nnabla picks its reader
    by extension and failed with IndexError (exit 70), and the failed run removed the user's file."""
    pytest.importorskip("nnabla")
    out = tmp_path / "notes.txt"
    out.write_text("the user's notes\n")  # -o names it: replacing it is what the user asked
    _, report = qcc.compile(MODEL, out, target="nnp", eval=str(DIGITS / "test.npz"))
    assert report["eval"]["runtime"]["name"].startswith("nnabla") and report["eval"]["runtime"]["agreement_with_simulator"] == 1.0
    assert out.read_bytes()[:2] == b"PK" and os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_an_interrupt_just_after_the_temporary_is_created_leaves_nothing(kind: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """^C lands between the system call that creates the temporary and the next Python step (a
    loaded machine deschedules the writer right there, and a watcher sees the file): the cleanup
    must already own the name."""
    from qcc.io import atomic_directory, atomic_write_bytes

    create = os.open if kind == "file" else os.mkdir

    def create_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        create(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open" if kind == "file" else "mkdir", create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        if kind == "file":
            atomic_write_bytes(tmp_path / "out.onnx", b"data")
        else:
            with atomic_directory(tmp_path / "out_c") as tmp:
                (tmp / "model.c").write_text("int x;")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
