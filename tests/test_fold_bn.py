"""fold-bn on per-channel affine chains: exact against ONNX Runtime on the original model.

Each case is an ONNX graph (BatchNormalization, Mul/Add/Sub with per-channel constants, Conv,
Gemm) run by ORT without optimizations as the oracle; qcc imports it, runs fold-bn and its
simulator must give the same outputs to float32 rounding, with the expected ops left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qcc.driver import load
from qcc.ir.core import Model
from qcc.pm import PassContext, PassManager
from qcc.sim import run_model
from qcc.testing import op_counts
from tests import ort_quant
from tests.densenet_like import densenet_block_bytes, densenet_block_data

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

C = 6


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _bn_params(prefix: str, seed: int, channels: int, tiny_var: bool) -> dict[str, np.ndarray]:
    r = _rng(seed)
    var = r.uniform(0.1, 3.0, channels)
    if tiny_var:  # Caffe2 DenseNet: variances down to 1e-12, so s = gamma / sqrt(eps) ~ 300
        var[::2] = 1e-12
    return {f"{prefix}_g": r.uniform(0.5, 2.0, channels), f"{prefix}_b": r.normal(size=channels),
            f"{prefix}_m": r.normal(size=channels), f"{prefix}_v": var}


class Builder:
    """Tiny ONNX graph builder: nodes, float32 initializers, one input `x`, one output `y`."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: dict[str, np.ndarray] = {}
        self.count = 0

    def const(self, name: str, data: np.ndarray) -> str:
        self.inits[name] = np.asarray(data, np.float32)
        return name

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        self.count += 1
        out = f"t{self.count}"
        self.nodes.append(onnx.helper.make_node(op, list(inputs), [out], name=f"{op.lower()}{self.count}", **attrs))
        return out

    def bn(self, x: str, seed: int, tiny_var: bool = False, channels: int = C) -> str:
        params = [self.const(k, v) for k, v in _bn_params(f"bn{seed}", seed, channels, tiny_var).items()]
        return self.op("BatchNormalization", x, *params, epsilon=1e-5)

    def conv(self, x: str, cin: int, cout: int, k: int, seed: int, pad: int = 0, group: int = 1,
             bias: bool = True) -> str:
        r = _rng(seed)
        w = self.const(f"w{seed}", r.normal(size=(cout, cin // group, k, k)) / np.sqrt(cin * k * k))
        ins = [x, w] + ([self.const(f"b{seed}", r.normal(size=cout))] if bias else [])
        return self.op("Conv", *ins, kernel_shape=[k, k], pads=[pad] * 4, group=group)

    def scale(self, op: str, x: str, shape: tuple[int, ...], seed: int) -> str:
        return self.op(op, x, self.const(f"c{seed}", _rng(seed).uniform(-1.5, 1.5, shape)))

    def model(self, y: str, x_shape: tuple[Any, ...]) -> bytes:
        helper = onnx.helper
        self.nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
        graph = helper.make_graph(
            self.nodes, "case", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            [onnx.numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        return bytes(proto.SerializeToString())


def folded(data: bytes, tmp_path: Path, feeds: dict[str, np.ndarray], spec: str = "fold-bn",
           rel: float = 2e-6) -> tuple[Model, PassContext]:
    """Import, run `spec`, and check the simulator against ORT on the original graph."""
    path = tmp_path / "case.onnx"
    path.write_bytes(data)
    model = load(path)
    ctx = PassContext()
    PassManager(spec).run(model, ctx)
    want = ort_quant.run(data, feeds, optimize=False)
    got = next(iter(run_model(model, feeds).values()))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= rel * np.abs(want).max(), np.abs(got - want).max() / np.abs(want).max()
    return model, ctx


def image(batch: int = 3, size: int = 5, seed: int = 7) -> dict[str, np.ndarray]:
    return {"x": _rng(seed).normal(size=(batch, C, size, size)).astype(np.float32)}


def test_conv_bn_mul_add_relu_becomes_one_conv(tmp_path: Path) -> None:
    b = Builder()
    h = b.bn(b.conv("x", C, C, 3, seed=1, pad=1, bias=False), 2, tiny_var=True)
    h = b.scale("Add", b.scale("Mul", h, (C, 1, 1), 3), (1, C, 1, 1), 4)
    model, ctx = folded(b.model(b.op("Relu", h), ("N", C, 5, 5)), tmp_path, image())
    assert op_counts(model) == {"Conv": 1, "Relu": 1, "Identity": 1}
    assert model.graph.nodes[0].outputs[0].name == "t4"  # the folded Conv's output: the Add's name
    assert "fold_bn" not in ctx.report


def test_conv_mul_sub_and_dense_scale_layers(tmp_path: Path) -> None:
    b = Builder()
    h = b.scale("Sub", b.scale("Mul", b.conv("x", C, C, 1, seed=1), (C, 1, 1), 2), (C, 1, 1), 3)
    h = b.op("Flatten", b.op("GlobalAveragePool", h))
    w = b.const("fc_w", _rng(4).normal(size=(4, C)))
    h = b.op("Gemm", h, w, b.const("fc_b", _rng(5).normal(size=4)), transB=1)
    h = b.scale("Add", b.scale("Mul", h, (4,), 6), (1, 4), 7)
    model, _ = folded(b.model(h, ("N", C, 5, 5)), tmp_path, image())
    assert set(op_counts(model)) == {"Conv", "GlobalAvgPool", "Flatten", "Dense", "Identity"}


def test_densenet_pattern_merges_into_one_batchnorm(tmp_path: Path) -> None:
    """Concat -> BN -> Mul -> Add -> Relu -> Conv: the Relu blocks folding; one BatchNorm is left."""
    b = Builder()
    left = b.op("Relu", b.conv("x", C, 2, 3, seed=1, pad=1))
    cat = b.op("Concat", "x", left, axis=1)
    n = C + 2
    h = b.scale("Add", b.scale("Mul", b.bn(cat, 2, tiny_var=True, channels=n), (n, 1, 1), 3), (n, 1, 1), 4)
    h = b.conv(b.op("Relu", h), n, 4, 3, seed=5, pad=1)
    model, ctx = folded(b.model(h, ("N", C, 5, 5)), tmp_path, image())
    assert op_counts(model) == {"Conv": 2, "Relu": 2, "Concat": 1, "BatchNorm": 1, "Identity": 1}
    (entry,) = ctx.report["fold_bn"]
    assert entry["merged"] == ["mul5", "add6"] and "followed by Relu" in entry["reason"]


def test_standalone_conv_turns_the_leftover_batchnorm_into_a_depthwise_conv(tmp_path: Path) -> None:
    b = Builder()
    h = b.scale("Add", b.scale("Mul", b.bn("x", 1, tiny_var=True), (C, 1, 1), 2), (C, 1, 1), 3)
    model, ctx = folded(b.model(b.op("Relu", h), ("N", C, 5, 5)), tmp_path, image(), "fold-bn{standalone=conv}")
    conv = model.graph.nodes[0]
    assert conv.op == "Conv" and conv.attrs["group"] == C and conv.input(1).type.shape == (C, 1, 1, 1)
    assert conv.outputs[0].name == "t3" and "depthwise" in ctx.report["fold_bn"][0]["reason"]


@pytest.mark.parametrize("group", [1, 2])
def test_batchnorm_before_an_unpadded_conv_folds_forward(tmp_path: Path, group: int) -> None:
    b = Builder()
    h = b.conv(b.scale("Add", b.bn("x", 1, tiny_var=True), (C, 1, 1), 2), C, 4, 3, seed=3, group=group)
    model, ctx = folded(b.model(h, ("N", C, 5, 5)), tmp_path, image())
    assert op_counts(model) == {"Conv": 1, "Identity": 1} and "fold_bn" not in ctx.report


def test_batchnorm_before_dense_folds_forward(tmp_path: Path) -> None:
    b = Builder()
    h = b.bn(b.op("Flatten", b.op("GlobalAveragePool", "x")), 1)
    h = b.op("Gemm", h, b.const("fc_w", _rng(2).normal(size=(C, 3))), b.const("fc_b", _rng(3).normal(size=3)))
    model, _ = folded(b.model(h, ("N", C, 5, 5)), tmp_path, image())
    assert "BatchNorm" not in op_counts(model) and "Dense" in op_counts(model)


def test_padding_refuses_a_shift_but_not_a_pure_scale(tmp_path: Path) -> None:
    b = Builder()
    shifted = b.conv(b.scale("Add", b.scale("Mul", "x", (C, 1, 1), 1), (C, 1, 1), 2), C, 2, 3, seed=3, pad=1)
    scaled = b.conv(b.scale("Mul", "x", (1, C, 1, 1), 4), C, 2, 3, seed=5, pad=1)
    model, ctx = folded(b.model(b.op("Concat", shifted, scaled, axis=1), ("N", C, 5, 5)), tmp_path, image())
    assert op_counts(model) == {"BatchNorm": 1, "Conv": 2, "Concat": 1, "Identity": 1}
    (entry,) = ctx.report["fold_bn"]
    bn = next(n for n in model.graph.nodes if n.op == "BatchNorm")
    assert entry["merged"] == ["add2"] and "pads with zeros" in entry["reason"] and bn.attrs["epsilon"] == 0.0


def test_non_channel_constants_are_left_alone(tmp_path: Path) -> None:
    b = Builder()
    h = b.scale("Mul", b.conv("x", C, C, 1, seed=1), (1, 1, 5, 5), 2)  # varies over space, not channels
    h = b.op("Add", h, b.conv("x", C, C, 1, seed=3))  # not a constant operand
    model, ctx = folded(b.model(h, ("N", C, 5, 5)), tmp_path, image())
    assert op_counts(model) == {"Conv": 2, "Mul": 1, "Add": 1, "Identity": 1} and "fold_bn" not in ctx.report


def test_densenet_block_folds_exactly(tmp_path: Path) -> None:
    """light_densenet121's first block: Conv -> BN -> Mul -> Add folds; Concat -> BN -> Mul -> Add merges."""
    feeds = densenet_block_data(2, seed=3)
    model, ctx = folded(densenet_block_bytes(), tmp_path, feeds, rel=1e-5)
    counts = op_counts(model)
    assert "Mul" not in counts and "Add" not in counts
    assert counts["BatchNorm"] == 7 and counts["Conv"] == 15  # six x1 + the transition's; 14 convs + head
    assert all(len(e["merged"]) == 2 for e in ctx.report["fold_bn"])
    model, _ = folded(densenet_block_bytes(), tmp_path, feeds, "fold-bn{standalone=conv}", rel=1e-5)
    assert "BatchNorm" not in op_counts(model) and op_counts(model)["Conv"] == 22
