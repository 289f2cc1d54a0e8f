"""ONNX and ONNX QDQ files in onnxruntime (CPU)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import attrs
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


CALIBRATION_LEVEL = "ORT_ENABLE_EXTENDED"
"""Graph optimizations of calibrate{engine=onnxruntime}'s session. Every activation is a graph
output, so no fusion can drop one; up to 'extended' (constant folding, eliminations, fusions
whose inputs are not outputs) the outputs are bit-identical to running with optimizations off
(tests/test_calib_ort.py). 'all' adds the NCHWc layout, whose convolutions sum in another order:
other last bits, so other statistics."""

_SHARED_BYTES = 4096
"""Float initializers from this size on are handed to onnxruntime as the IR's arrays (external
initializers) instead of serialized into the model: ResNet-50's 100 MB of weights cost 0.06 s to
serialize and 0.1 s for onnxruntime to parse back, most of a plain pass over 8 samples. Smaller
ones (shapes, biases of a few channels) stay inline, where shape inference can read them."""


@attrs.define(eq=False)
class CalibrationSession:
    """An onnxruntime session and the arrays it reads its weights from (kept alive with it)."""

    session: Any
    weights: dict[str, np.ndarray]

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        out: list[np.ndarray] = self.session.run(names, feeds)
        return out


def calibration_session(proto: Any, arrays: Mapping[str, np.ndarray] | None = None) -> CalibrationSession:
    """An onnxruntime session for `proto` (an onnx.ModelProto, changed: its large float
    initializers move out) that calibration runs with every activation as an output. `arrays`:
    the IR's constants by name, handed over as they are when an initializer holds one (instead of
    a copy read back from the proto: 0.02-0.05 s for ResNet-50).

    One thread, that does not spin. onnxruntime's convolutions split a batch smaller than its
    thread count across the threads in another order of sums: other last bits on 2 threads at
    batch 1 than on 1 thread or at batch 4 (tests/test_calib_ort.py), so statistics would depend
    on the machine's cores. At one thread they depend on neither the batch nor the cores. It
    costs no time on 2 cores: calibration bins one batch's outputs on a thread of its own
    (qcc.sim.background) while onnxruntime runs the next, and a second onnxruntime thread (or one
    that spins while it waits) takes the binning thread's core (benchmarks.md, "Branch floor10").
    More cores are used by sharding the samples (`--workers N`), which keeps the batches."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    weights: dict[str, np.ndarray] = {}
    for tensor in proto.graph.initializer:
        # the size from the dims: reading raw_data copies the bytes (protobuf), and most are not read again
        if (tensor.data_type == onnx.TensorProto.FLOAT and tensor.HasField("raw_data")
                and 4 * math.prod(tensor.dims) >= _SHARED_BYTES):
            known = (arrays or {}).get(tensor.name)
            same = known is not None and known.dtype == np.float32 and known.shape == tuple(tensor.dims)
            weights[tensor.name] = np.ascontiguousarray(known if same else numpy_helper.to_array(tensor))
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", "qcc-calibrate-memory"  # never read: supplied below
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, CALIBRATION_LEVEL)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.intra_op_num_threads = 1
    if weights:
        so.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()])
    session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return CalibrationSession(session, weights)


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
