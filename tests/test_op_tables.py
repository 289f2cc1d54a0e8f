"""The op tables and the support matrix: every column says what its frontend or backend does,
names only registered ops, and docs/ops.md is what `qcc ops --markdown` prints.

The backend columns are checked by compiling a one-op model per registered op (tests/op_models.py)
for each target; the onnx-qdq int/float split by ONNX Runtime's own optimized graph.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.errors import InternalError, UnsupportedError
from qcc.formats import nnabla_functions as nf
from qcc.ir.registry import all_ops, has_op
from qcc.op_matrix import COLUMNS, build_matrix
from qcc.plugins import scoped_registry
from tests.op_models import calibration, one_op_model

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "QCC_DISABLE_PLUGIN_AUTOLOAD": "1"}


def builtin_matrix():  # type: ignore[no-untyped-def]
    with scoped_registry() as reg:
        return build_matrix(reg)


# ---------------------------------------------------------------- the generated document


def test_docs_ops_md_is_current() -> None:
    proc = subprocess.run([sys.executable, "-m", "qcc", "ops", "--markdown", "--no-plugins"], capture_output=True,
                          text=True, cwd=ROOT, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    current = (ROOT / "docs" / "ops.md").read_text()
    assert current == proc.stdout, "docs/ops.md is stale: regenerate it with `qcc ops --markdown > docs/ops.md`"


def test_cli_prints_the_ten_columns_and_every_op() -> None:
    proc = subprocess.run([sys.executable, "-m", "qcc", "ops"], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split("  ")[0] == "op"
    assert [c.strip() for c in lines[0].split("  ") if c.strip()][1:] == list(COLUMNS)
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:] if line and line.split()[0] in all_ops()}
    assert set(rows) == set(all_ops())
    assert rows["Conv"] == ["yes", "yes", "yes", "yes", "int", "yes", "yes", "yes", "int", "int"]


# ---------------------------------------------------------------- tables name registered ops


def test_every_table_names_registered_ops() -> None:
    from qcc.backends.c.modes import MODES
    from qcc.backends.onnx_qdq import ORT_INTEGER_OPS

    from qcc.formats.onnx_export import EXPORTERS

    matrix = builtin_matrix()
    assert matrix.columns == COLUMNS and not matrix.undeclared
    assert matrix.unknown == {}
    named = {*nf.FUNCTION_OPS.values(), *(op for op, _ in nf.SCALARS.values()), *ORT_INTEGER_OPS,
             *(op for mode in MODES for op in mode.lowerings), *(op for mode in MODES for op in mode.float_ops())}
    assert sorted(op for op in named if not has_op(op)) == []
    assert ORT_INTEGER_OPS <= set(EXPORTERS)


def test_a_table_naming_an_unregistered_op_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from qcc.formats.onnx_export import EXPORTERS

    monkeypatch.setitem(EXPORTERS, "NoSuchOp", EXPORTERS["Relu"])
    matrix = builtin_matrix()
    assert matrix.unknown == {"onnx": ("NoSuchOp",), "onnx-qdq": ("NoSuchOp",)}


def test_an_importer_creating_an_undeclared_op_is_an_internal_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import TensorProto, helper

    from qcc.frontends import onnx as onnx_frontend

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    assert [n.op for n in qcc.load(path).graph.nodes] == ["Relu"]
    monkeypatch.setitem(onnx_frontend.EMITS, "Relu", frozenset({"Sigmoid"}))
    with pytest.raises(InternalError, match=r"node 'relu'.*importer of Relu created IR op\(s\) Relu"):
        qcc.load(path)


def test_nnabla_names_resolve_both_ways() -> None:
    from qcc.passes.quantutil import canonical_op

    assert [canonical_op(n) for n in ("ReLU", "AveragePooling", "Affine", "Max", "Mean", "Relu")] == \
        ["Relu", "AvgPool", "Dense", "Max", "ReduceMean", "Relu"]
    assert all(nf.ir_op(nf.nnabla_function(op)) == op for op in nf.OP_FUNCTIONS)
    assert nf.scalar_function("Sub", scalar_left=False) == ("AddScalar", True)
    assert nf.scalar_function("Div", scalar_left=False) is None
    assert nf.direct_mismatch(nf.DIRECT_BY_FUNCTION["ReLU"], {"inplace": True}) is None


def test_plugin_ops_frontends_and_backends_appear(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        import numpy as np
        import qcc
        from qcc.cli import main
        from qcc.ir.registry import OpDef, register

        @register
        class PluginSquare(OpDef):
            """x * x."""
            traits = frozenset({"elementwise"})

            @staticmethod
            def kernel(node, xs):
                return [xs[0] * xs[0]]

        class Backend:
            name, extensions, output_is_directory, requires = "squarer", (".sq",), False, ()
            def op_support(self):
                return {"squarer": {"PluginSquare": "yes", "Relu": "int"}}
            def write(self, model, out, **options):
                pass

        class Frontend:
            name, extensions = "legacy", (".legacy",)
            def load(self, path, **options):
                raise NotImplementedError

        qcc.plugins.register(qcc.Plugin(api_version=1, backends={"squarer": Backend}, frontends={"legacy": Frontend}),
                             "squarer-plugin")
        raise SystemExit(main(["ops", "--markdown"]))
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| op |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[3:] == [*COLUMNS, "legacy import", "squarer"]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| PluginSquare |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "elementwise" and cells[-2:] == ["?", "yes"]
    assert cells[3:6] == ["-", "-", "-"]
    assert "- squarer: backend squarer (squarer-plugin)" in proc.stdout
    assert "- ?: the plugin does not say" in proc.stdout


# ---------------------------------------------------------------- columns against the targets

TARGETS = {  # column -> (target, quantize)
    "onnx": ("onnx", "none"), "nnp": ("nnp", "none"), "nnb": ("nnb", "none"),
    "c-float": ("c", "none"), "c-fixed": ("c", "fixed8"), "c-affine": ("c", "int8"),
}


@pytest.mark.parametrize("column", list(TARGETS))
def test_backend_column_is_what_the_backend_compiles(column: str, tmp_path: Path) -> None:
    if column == "nnp":
        pytest.importorskip("nnabla")
    target, scheme = TARGETS[column]
    declared = builtin_matrix().cells[column]
    wrong = []
    for op in sorted(all_ops()):
        model = one_op_model(op)
        np.savez(tmp_path / "calib.npz", **calibration(model))
        out = tmp_path / f"{op}.{target}"
        try:
            qcc.compile(model, out, target=target, quantize=scheme,
                        calib=str(tmp_path / "calib.npz") if scheme != "none" else None)
            compiled = True
        except UnsupportedError as exc:
            compiled, why = False, str(exc)
        if compiled != (op in declared):
            wrong.append(f"{op}: {'compiles' if compiled else 'fails (' + why[:120] + ')'} but the column says "
                         f"{declared.get(op, '-')}")
    assert wrong == [], f"column {column!r} disagrees with target {target}: " + "; ".join(wrong)


def test_onnx_qdq_int_and_float_are_what_onnx_runtime_runs(tmp_path: Path) -> None:
    from tests import ort_quant

    declared = builtin_matrix().cells["onnx-qdq"]
    wrong = []
    for op, mark in sorted(declared.items()):
        model = one_op_model(op)
        np.savez(tmp_path / "calib.npz", **calibration(model))
        out = tmp_path / f"{op}.onnx"
        qcc.compile(model, out, target="onnx-qdq", passes="calibrate,quantize-affine{dtype=uint8}",
                    calib=str(tmp_path / "calib.npz"))
        floats = ort_quant.float_ops(out)
        if (mark == "int") != (not floats):
            wrong.append(f"{op}: marked {mark}, ONNX Runtime runs {dict(floats) or 'no op'} on float data")
    assert wrong == []
