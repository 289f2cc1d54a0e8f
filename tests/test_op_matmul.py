"""Batched MatMul and Einsum (issue 17): a product with a constant matrix is Dense at any rank
(per-channel int8 weights, QGemm in ONNX Runtime), activation x activation is MatMul (int8 in
QDQ: QLinearMatMul; in C: int32 sums, bit-exact with qcc.sim.affine_int), Einsum the forms
attention uses. An attention block quantizes with int8 products and float islands (Softmax,
LayerNorm), each a report line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import qcc
from qcc.errors import UnsupportedError
from qcc.ir.types import Affine
from tests import ort_quant
from tests.op_check import check_c, check_onnx, needs_gcc, onnx_model

RNG = np.random.default_rng(9)


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("equation,shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 7, 4)]),
    ("bhqk,bhkd->bqhd", [(2, 3, 5, 7), (2, 3, 7, 4)]),
    ("bqhd,bkhd->bhqk", [(2, 5, 3, 4), (2, 7, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 5, 4), (2, 3, 4, 6)]),
    ("bij->bji", [(2, 3, 5)]),
    ("bij->bi", [(2, 3, 5)]),
])
def test_einsum_forms_match_onnxruntime(tmp_path: Path, equation: str, shapes: list) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    inputs = dict(zip(names, shapes))
    model = check_onnx(tmp_path, onnx_model([node], inputs, {"y": None}, opset=13),
                       {n: randn(*s) for n, s in inputs.items()})
    assert "Einsum" not in {n.op for n in model.graph.nodes}


def test_einsum_with_a_weight_is_dense(tmp_path: Path) -> None:
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation="btd,de->bte")
    model = check_onnx(tmp_path, onnx_model([node], {"x": (2, 5, 4)}, {"y": None}, {"w": randn(4, 6)}, opset=13),
                       {"x": randn(2, 5, 4)})
    assert [n.op for n in model.graph.nodes] == ["Reshape", "Dense", "Reshape"]


def test_unsupported_einsum_is_one_line(tmp_path: Path) -> None:
    node = helper.make_node("Einsum", ["x"], ["y"], equation="ii->i", name="diag")
    path = tmp_path / "e.onnx"
    path.write_bytes(onnx_model([node], {"x": (4, 4)}, {"y": None}, opset=13))
    with pytest.raises(UnsupportedError, match=r"node 'diag' \(Einsum 'ii->i'\)") as exc:
        qcc.load(path)
    assert "\n" not in str(exc.value)


def attention_proto(tokens: int = 6, width: int = 8, heads: int = 2) -> bytes:
    """A transformer block: q/k/v projections, per-head softmax(q k^T / sqrt(d)) v by Einsum and
    MatMul, output projection, residual and LayerNormalization."""
    depth = width // heads
    make = helper.make_node
    nodes = [make("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    for n in "qkv":
        nodes += [make("Reshape", [n, "heads_shape"], [f"{n}4"]), make("Transpose", [f"{n}4"], [f"{n}h"], perm=[0, 2, 1, 3])]
    nodes += [make("Einsum", ["qh", "kh"], ["scores"], equation="bhqd,bhkd->bhqk"),
              make("Mul", ["scores", "scale"], ["scaled"]), make("Softmax", ["scaled"], ["probs"], axis=-1),
              make("MatMul", ["probs", "vh"], ["context"]), make("Transpose", ["context"], ["ct"], perm=[0, 2, 1, 3]),
              make("Reshape", ["ct", "merge_shape"], ["merged"]), make("MatMul", ["merged", "wo"], ["projected"]),
              make("Add", ["x", "projected"], ["residual"]),
              make("LayerNormalization", ["residual", "gamma", "beta"], ["y"], axis=-1)]
    inits = {f"w{n}": randn(width, width, scale=0.4) for n in "qkvo"}
    inits.update(heads_shape=np.array([1, tokens, heads, depth], np.int64), merge_shape=np.array([1, tokens, width], np.int64),
                 scale=np.array(1 / np.sqrt(depth), np.float32), gamma=randn(width, scale=0.2) + 1, beta=randn(width, scale=0.2))
    return onnx_model(nodes, {"x": (1, tokens, width)}, {"y": None}, inits, opset=17)


def test_attention_block_int8_in_onnxruntime(tmp_path: Path) -> None:
    proto = attention_proto()
    (tmp_path / "float").mkdir()
    check_onnx(tmp_path / "float", proto, {"x": randn(1, 6, 8)})
    source = tmp_path / "block.onnx"
    source.write_bytes(proto)
    calib = randn(16, 6, 8)
    np.savez(tmp_path / "calib.npz", x=calib)
    compiled, report = qcc.compile(source, tmp_path / "q.onnx", quantize="int8", calib=str(tmp_path / "calib.npz"))
    weights = [n.input(1) for n in compiled.graph.nodes if n.op == "Dense"]
    assert len(weights) == 4 and all(isinstance(w.quant, Affine) and w.quant.axis == 1 for w in weights)
    fused = ort_quant.fused_ops(tmp_path / "q.onnx")
    assert fused["QGemm"] == 4 and fused["QLinearMatMul"] == 2 and fused["QLinearSoftmax"] == 1
    assert dict(ort_quant.float_ops(tmp_path / "q.onnx")) == {"LayerNormalization": 1}
    assert [i["op"] for i in report["onnx-qdq"]["float_islands"]] == ["LayerNorm"]
    want = np.concatenate([ort_quant.run(source, {"x": calib[i:i + 1]}) for i in range(16)])
    got = np.concatenate([ort_quant.run(tmp_path / "q.onnx", {"x": calib[i:i + 1]}) for i in range(16)])
    assert ort_quant.sqnr_db(got, want) > 20


@needs_gcc
def test_attention_block_in_c(tmp_path: Path) -> None:
    """C float within float32 rounding of the reference; C int8 bit-exact, Softmax and LayerNorm
    the only float islands."""
    source = tmp_path / "block.onnx"
    source.write_bytes(attention_proto())
    compiled = check_c(tmp_path, lambda: qcc.load(source), {"x": randn(1, 6, 8)})
    islands = compiled.metadata["test.report"]["c"]["float_islands"]
    assert sorted(i["op"] for i in islands) == ["LayerNorm", "Softmax"]
    assert sum(n.op == "MatMul" for n in compiled.graph.nodes) == 2
