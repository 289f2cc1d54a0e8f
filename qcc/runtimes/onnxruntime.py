"""ONNX and ONNX QDQ files in onnxruntime (CPU)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from qcc.runtimes.base import FLOAT, Runtime, Tolerance

QDQ = Tolerance(20.0, 0.98, "onnxruntime's integer kernels requantize with float scales and their own "
                "rounding: one step apart from qcc's simulation on a few elements")


def _session(model: bytes | str, optimize: bool) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:  # the QDQ graph computed as written, in float (what qdq_loss_debug runs)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


class OrtRuntime(Runtime):
    """An .onnx file in onnxruntime, graph optimizations on (integer kernels for QDQ)."""

    def __init__(self, path: str | os.PathLike[str], tolerance: Tolerance = FLOAT, optimize: bool = True) -> None:
        import onnxruntime as ort

        self.path = os.fspath(path)
        self.session = _session(self.path, optimize)
        self.inputs = tuple(i.name for i in self.session.get_inputs())
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        first = self.session.get_inputs()[0].shape if self.inputs else [None]
        self.batch = first[0] if first and isinstance(first[0], int) else None
        self.tolerance = tolerance
        self.optimize = optimize
        self.name = f"onnxruntime {ort.__version__} (CPU, graph optimizations {'on' if optimize else 'off'})"
        self._tap: Any = None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self.session.run(None, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()})
        return {name: np.asarray(a) for name, a in zip(self.outputs, arrays)}

    def tensors(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Every node output, from the file with each made a graph output and optimizations off
        (onnxruntime.quantization.qdq_loss_debug does the same)."""
        if self._tap is None:
            self._tap = _tapped_session(self.path)
        session, names = self._tap
        arrays = session.run(names, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()})
        return {n: np.asarray(a) for n, a in zip(names, arrays) if isinstance(a, np.ndarray)}


def _tapped_session(path: str) -> tuple[Any, list[str]]:
    import onnx

    proto = onnx.load(path)
    known = {o.name for o in proto.graph.output}
    names = [o.name for o in proto.graph.output]
    for node in proto.graph.node:
        for out in node.output:
            if out and out not in known:
                known.add(out)
                names.append(out)
                proto.graph.output.add().name = out
    return _session(proto.SerializeToString(), optimize=False), names
