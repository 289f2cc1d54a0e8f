"""The checks every op of docs/adding-an-op.md gets, against the real oracles (issue-17 ops).

- `onnx_model`: a small ONNX graph; `check_onnx`: onnxruntime runs it, qcc imports it and matches
  within `rtol` of the output's scale, and the ONNX qcc writes back runs in onnxruntime to the same.
- `check_qdq`: the uint8 QDQ model onnxruntime runs is within one output step of qcc's fake-quant
  simulator (ONNX Runtime and qcc round float kernels' results differently, at most one step).
- `check_torch`: a torch module imported through torch.export emits the expected IR ops and qcc's
  interpreter matches torch within `atol`.
- `check_c`: the gcc-built C program in float within `rtol` of the reference kernels, and in
  affine int8 bit for bit what `qcc.sim.affine_int` computes.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import qcc
from qcc.ir import Model
from qcc.sim.affine_int import run_affine_int
from qcc.sim.interpreter import Interpreter
from tests.onnx_zoo import ort_run

EPS = float(np.finfo(np.float32).eps)
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def onnx_model(nodes: Sequence[Any], inputs: dict[str, Sequence[Any]], outputs: dict[str, int | None],
               inits: dict[str, np.ndarray] | None = None, opset: int = 18) -> bytes:
    """A graph of `nodes`; inputs by shape (float32), outputs by element type (None: float32)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        list(nodes), "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT if t is None else t, None) for n, t in outputs.items()],
        initializer=[numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())


def close(got: np.ndarray, want: np.ndarray, rtol: float) -> bool:
    """Equal shapes and every element within rtol of the largest magnitude (exact for integers)."""
    if got.shape != want.shape:
        return False
    if want.dtype.kind in "iu":
        return bool(np.array_equal(got, want))
    scale = max(float(np.max(np.abs(want))), 1.0) if want.size else 1.0
    return bool(np.max(np.abs(got.astype(np.float64) - want), initial=0.0) <= rtol * scale)


def check_onnx(tmp: Path, proto: bytes, feeds: dict[str, np.ndarray], rtol: float = 8 * EPS) -> Model:
    """onnxruntime vs qcc's import, and qcc's ONNX export back in onnxruntime; returns the model."""
    source = tmp / "source.onnx"
    source.write_bytes(proto)
    want = ort_run(proto, feeds)
    model = qcc.load(source)
    got = qcc.run(model, feeds)
    assert len(got) == len(want)
    for w, (name, g) in zip(want, got.items()):
        assert close(g, w, rtol), (name, g.shape, w.shape, np.max(np.abs(g.astype(np.float64) - w), initial=0))
    qcc.compile(source, tmp / "copy.onnx")
    for w, back in zip(want, ort_run(str(tmp / "copy.onnx"), feeds)):
        assert close(back, w, rtol)
    return model


def check_qdq(tmp: Path, model: Model, feeds: dict[str, np.ndarray]) -> Model:
    """QDQ uint8 in onnxruntime within one output step of qcc's simulation; returns the compiled model."""
    np.savez(tmp / "calib.npz", **feeds)
    compiled, _ = qcc.compile(model, tmp / "q.onnx", target="onnx-qdq", quantize="uint8",
                              calib=str(tmp / "calib.npz"))
    simulated = Interpreter(compiled, quantized=True).run(feeds)
    for value, got in zip(compiled.graph.outputs, ort_run(str(tmp / "q.onnx"), feeds, optimize=True)):
        want = simulated[value.name]
        if value.type.dtype != "float32":
            continue  # indices of equal quantized values may differ in rounding corner cases
        step = float(value.quant.scale[0])  # type: ignore[union-attr]
        assert np.max(np.abs(got - want)) <= step * 1.01, (value.name, np.max(np.abs(got - want)), step)
    return compiled


def c_outputs(model: Model, feeds: dict[str, np.ndarray], directory: Path, sanitize: bool = True) -> np.ndarray:
    """The gcc-built program's outputs, one row per sample."""
    from tests.test_backend_c import build, run_c

    size = sum(int(np.prod([d if isinstance(d, int) else 1 for d in v.type.shape])) for v in model.graph.outputs)
    (x,) = feeds.values()
    return run_c(build(model, directory, sanitize=sanitize), x, size)


def rows(results: dict[str, np.ndarray], model: Model, count: int) -> np.ndarray:
    return np.concatenate([results[v.name].reshape(count, -1).astype(np.float32) for v in model.graph.outputs], axis=1)


@needs_gcc
def check_c(tmp: Path, build_model: Any, feeds: dict[str, np.ndarray], rtol: float = 16 * EPS,
            sanitize: bool = True) -> Model:
    """C float vs the reference kernels, C affine int8 bit-exact vs qcc.sim.affine_int (one input);
    `build_model()` makes a fresh model. Returns the int8 model."""
    (x,) = feeds.values()
    count = len(x)
    model = build_model()
    reference = rows(qcc.run(model, feeds), model, count)
    assert close(c_outputs(model, feeds, tmp / "cfloat", sanitize), reference, rtol)
    np.savez(tmp / "calib.npz", **feeds)
    compiled, report = qcc.compile(build_model(), tmp / "caffine", target="c", quantize="int8",
                                   calib=str(tmp / "calib.npz"))
    want = rows(run_affine_int(compiled, feeds), compiled, count)
    got = c_outputs(compiled, feeds, tmp / "caffine_build", sanitize)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    compiled.metadata["test.report"] = report
    return compiled


def check_torch(net: Any, x: Any, ops: list[str], atol: float) -> Model:
    """`net` (eval mode) on the torch tensor `x`: imported as `ops`, and qcc's output within `atol` of torch's."""
    model = qcc.load(net, example_inputs=x)
    assert [n.op for n in model.graph.nodes] == ops
    got = qcc.run(model, {model.graph.inputs[0].name: x.numpy()})[model.graph.outputs[0].name]
    np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=0, atol=atol)
    return model
