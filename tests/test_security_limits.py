"""Issue 20, high and medium: limits checked from declared sizes before anything is allocated,
special files refused instead of read forever, and models large enough to break recursion.

Each hostile input is built here and given to the `qcc` command under a 2 GiB address-space cap
(`run_all(..., address_space=...)`), so an allocation the limits do not bound is a MemoryError
(exit 70), not a slow success; the refusal must be exit 3 naming the file and the limit.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qcc
from bench.fuzz_classes import zip_of_zeros
from qcc import limits
from tests.cli_util import DIGITS
from tests.test_hardening import one_error, run_all, run_qcc

MODEL = DIGITS / "digits_cnn.onnx"
CAP = 2 * 1024**3
F32 = np.float32
BIG = 2**17  # a (BIG, 1) op (1, BIG) result is 2^34 elements (64 GiB); the inputs are 512 KiB each


def _model(path: Path, nodes: list[object], inits: dict[str, np.ndarray], result: str = "r") -> Path:
    """`nodes` compute `result` from constants; the graph adds its sum to its input (so it is used)."""
    tail = [helper.make_node("ReduceSum", [result], ["s"], name="sum", keepdims=0),
            helper.make_node("Cast", ["s"], ["sf"], name="sf", to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "sf"], ["y"], name="use")]
    graph = helper.make_graph([*nodes, *tail], "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


FOLDING_BOMBS = {
    "add": ([helper.make_node("Add", ["a", "b"], ["r"], name="bomb")],
            {"a": np.ones((BIG, 1), F32), "b": np.ones((1, BIG), F32)}),
    "gather": ([helper.make_node("Gather", ["a", "i"], ["r"], name="bomb", axis=0)],
               {"a": np.ones((1, BIG), F32), "i": np.zeros(BIG, np.int64)}),
    "pad": ([helper.make_node("Pad", ["a", "p"], ["r"], name="bomb")],
            {"a": np.ones((1, 1), F32), "p": np.array([0, 0, BIG, BIG], np.int64)}),
    "concat": ([helper.make_node("Concat", ["a"] * 20000, ["r"], name="bomb", axis=0)], {"a": np.ones(2**16, F32)}),
}


def test_folding_bombs_are_refused_before_the_result_exists(tmp_path: Path) -> None:
    paths = [_model(tmp_path / f"{name}.onnx", *case) for name, case in FOLDING_BOMBS.items()]
    runs = run_all([["compile", p, "-o", tmp_path / "out.onnx"] for p in paths], address_space=CAP)
    for path, run in zip(paths, runs):
        line = one_error(run, 3, path)
        assert "node 'bomb'" in line and "over the limit" in line, line
        assert run.maxrss_mb < 400, (path.name, run.maxrss_mb)
    assert not (tmp_path / "out.onnx").exists()


def test_folded_constants_count_against_a_running_total(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four folded Adds of 40 MB each: every one is under a 64 MB limit, together they are not."""
    nodes = [helper.make_node("Add", ["a", "b"], [f"r{i}"], name=f"fold{i}") for i in range(4)]
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(4)], ["r"], name="total"))
    path = _model(tmp_path / "total.onnx", nodes, {"a": np.ones((2500, 1), F32), "b": np.ones((1, 4000), F32)})
    refused = run_qcc("compile", path, "-o", tmp_path / "out.onnx", "--limit", "max_parameter_bytes=64e6")
    line = one_error(refused, 3, path)
    assert "parameters and folded constants" in line and "64000000" in line, line
    monkeypatch.setattr(limits, "_current", None)
    limits.configure(max_parameter_bytes=300_000_000)  # room for all of it: the same model imports
    assert len(qcc.load(path).graph.nodes) == 1


def test_archive_members_just_under_the_ratio_floor_do_not_add_up(tmp_path: Path) -> None:
    """200 members of 16 MiB - 1 byte each (3.2 GB, under the 4 GiB archive limit), 16 KiB compressed each."""
    nnp = tmp_path / "digits.nnp"
    qcc.compile(MODEL, nnp)
    with zipfile.ZipFile(nnp) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    names = [f"parameter{i}.protobuf" for i in range(200)]
    bomb = tmp_path / "members.nnp"
    bomb.write_bytes(zip_of_zeros(names, 16 * 1024**2 - 1, members))
    npz = tmp_path / "members.npz"
    npz.write_bytes(zip_of_zeros([f"x{i}.npy" for i in range(200)], 16 * 1024**2 - 1, {}))
    assert bomb.stat().st_size < 10 * 1024**2
    runs = run_all([["inspect", bomb], ["compile", MODEL, "-o", tmp_path / "q.onnx", "--target", "onnx-qdq",
                                        "--quantize", "int8", "--calib", npz]], address_space=CAP)
    for path, run in zip((bomb, npz), runs):
        line = one_error(run, 3, path)
        assert "together" in line and "ratio" in line, line
        assert run.maxrss_mb < 400


def test_an_nnb_over_the_format_cap_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / "big.nnb"
    with open(big, "wb") as handle:  # 3 GiB, sparse: nothing is written but the size
        handle.truncate(3 * 1024**3)
    run = run_all([["inspect", big]], address_space=CAP)[0]
    line = one_error(run, 3, big)
    assert "limit" in line and run.maxrss_mb < 300, (line, run.maxrss_mb)


def test_a_settings_file_over_its_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    line = "  tensor_%07d: FIXED8_3\n"
    settings.write_text("variables:\n" + "".join(line % i for i in range(800_000)))  # 20 MB of valid YAML
    run = run_qcc("compile", MODEL, "-o", tmp_path / "out.onnx", "--settings", settings)
    message = one_error(run, 3, settings)
    assert "max_settings_bytes" in message, message
    assert run.maxrss_mb < 400


def test_special_files_are_refused_not_read_or_waited_for(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = {}
    for kind, target, extensions in (("zero", "/dev/zero", (".onnx", ".yaml", ".nnb")),
                                     ("random", "/dev/urandom", (".nnp",)),
                                     ("fifo", str(fifo), (".npz", ".yaml"))):
        for ext in extensions:
            paths[kind + ext] = tmp_path / f"{kind}{ext}"
            os.symlink(target, paths[kind + ext])
    out = tmp_path / "out.onnx"
    commands: list[list[str | Path]] = []
    for path in paths.values():
        ext = path.suffix
        if ext in (".onnx", ".nnp"):
            commands.append(["compile", path, "-o", out])
        elif ext == ".npz":
            commands.append(["compile", MODEL, "-o", out, "--eval", path])
        elif ext == ".yaml":
            commands.append(["compile", MODEL, "-o", out, "--settings", path])
        else:
            commands.append(["inspect", path])
    for path, run in zip(paths.values(), run_all(commands, address_space=CAP)):
        line = one_error(run, 3, path)
        assert "not a regular file" in line, line
        assert run.maxrss_mb < 400
    assert not out.exists()


def _chain(n: int) -> object:
    nodes = [helper.make_node(("Relu", "Neg")[i % 2], ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"], name=f"n{i}")
             for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, ["N", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_eval_on_a_long_chain_does_not_recurse(tmp_path: Path) -> None:
    """--eval copies the model; copy.deepcopy used to recurse once per node (RecursionError at ~80)."""
    model = tmp_path / "chain.onnx"
    model.write_bytes(_chain(300).SerializeToString())  # type: ignore[attr-defined]
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    run = run_qcc("compile", model, "-o", tmp_path / "out.onnx", "--eval", data)
    assert run.returncode == 0, run.stderr
    assert "top-1 agreement with the simulator 1.0000" in run.stdout, run.stdout


@pytest.mark.parametrize("text", ["inf", "1e400", "2.5"])
def test_a_limit_value_that_is_not_a_positive_whole_number_is_a_usage_error(text: str) -> None:
    run = run_qcc("compile", MODEL, "-o", "/nonexistent/x.onnx", "--limit", f"max_nodes={text}")
    line = one_error(run, 2, "max_nodes")
    assert text[:4] in line, line
