"""ONNX Runtime helpers shared by the QDQ tests and bench/compare_ort_quant.py.

quantize_static is ONNX Runtime's own tool, run the way its documentation recommends
(quant_pre_process first: shape inference and graph optimizations such as BatchNorm folding).
"""

from __future__ import annotations

import collections
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ORT_METHODS = ("MinMax", "Entropy", "Percentile")
INTEGER_OPS = frozenset({"QGemm", "QAttention", "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat",
                         "DynamicQuantizeLinear", "QuantizeLinear"})
"""Ops (besides QLinear*) that compute on integers in ONNX Runtime's optimized graph."""
MOVES = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Split",
                   "Slice", "Gather", "Resize", "Pad", "GlobalMaxPool", "DepthToSpace", "SpaceToDepth", "ReduceMax",
                   "ArgMax"})
"""Ops that only move or compare values: integer or float like their first input."""


def batches(feeds: dict[str, np.ndarray], size: int) -> Iterator[dict[str, np.ndarray]]:
    n = len(next(iter(feeds.values())))
    for start in range(0, n, size):
        yield {k: v[start:start + size] for k, v in feeds.items()}


def quantize_static(model: str | os.PathLike[str], out: str | os.PathLike[str], calib: dict[str, np.ndarray],
                    method: str = "MinMax", per_channel: bool = True, activation: str = "uint8",
                    batch_size: int | None = None, reduce_range: bool = False) -> None:
    """onnxruntime.quantization.quantize_static in QDQ format on `calib` (arrays by input name).

    batch_size None feeds all samples at once: with a smaller last batch, ORT 1.23's Entropy and
    Percentile calibrators fail (np.asarray over batches of unequal length).
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
    )
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = batches(calib, batch_size or len(next(iter(calib.values()))))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
        ort_quantize_static(
            str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
            reduce_range=reduce_range, calibrate_method=getattr(CalibrationMethod, method),
            activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )


def session(model: str | os.PathLike[str] | bytes, threads: int = 0, optimize: bool = True,
            optimized_path: str | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif optimized_path:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = optimized_path
    src = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def run(model: str | os.PathLike[str] | bytes, feeds: dict[str, np.ndarray], batch_size: int = 256,
        optimize: bool = True) -> np.ndarray:
    """The first output over all samples (batched; a static batch of 1 is honoured)."""
    sess = session(model, optimize=optimize)
    dims = sess.get_inputs()[0].shape
    size = 1 if dims and dims[0] == 1 else batch_size
    return np.concatenate([sess.run(None, b)[0] for b in batches(feeds, size)])


def fused_ops(model: str | os.PathLike[str] | bytes) -> collections.Counter[str]:
    """Op types in the graph ONNX Runtime actually runs (its optimized model)."""
    return collections.Counter(n.op_type for n in optimized_graph(model).node)


def optimized_graph(model: str | os.PathLike[str] | bytes) -> Any:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        session(model, optimized_path=path)
        return onnx.load(path).graph


def float_ops(model: str | os.PathLike[str] | bytes) -> collections.Counter[str]:
    """Nodes ONNX Runtime runs on float data (QuantizeLinear/DequantizeLinear not counted).

    Walks the optimized graph: a tensor is integer when an integer kernel or an integer
    initializer produced it, and a value-moving op (MaxPool, Reshape...) is as float as its input.
    """
    graph = optimized_graph(model)
    integer = {t.name for t in graph.initializer if t.data_type not in (1, 10, 11, 16)}  # not float types
    found: collections.Counter[str] = collections.Counter()
    for node in graph.node:
        op = node.op_type
        is_int = op.startswith("QLinear") or op in INTEGER_OPS
        if op in MOVES:
            is_int = node.input[0] in integer
        if op == "QGemm" and len(node.input) < 8:  # no output scale: QGemm writes float
            is_int = False
        if is_int:
            integer.update(node.output)
        elif op != "DequantizeLinear":
            found[op] += 1
    return found


def sqnr_db(test: np.ndarray, ref: np.ndarray) -> float:
    noise = float(np.sum((test.astype(np.float64) - ref) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * float(np.log10(signal / noise))


def top1(logits: np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))
