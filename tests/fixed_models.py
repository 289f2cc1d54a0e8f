"""Fixed-point annotation for tests that must not depend on the quantization passes.

`annotate_fixed` gives every activation and Conv/Dense parameter a FixedPoint position from the
float ranges seen on calibration data (no saturation), keeping what the nnb rules require:
views, Relu and MaxPool keep their input's annotation, biases take the output's position and
fy <= fx + fw, and activations stored by truncation (nnabla-c-runtime's rule, so that
run_model(quantized=True) runs its integer kernels). `jitter` moves positions off the natural
choice to exercise the rescaling paths.
"""

from __future__ import annotations

import math

import numpy as np

from qcc.ir.core import Model, Value
from qcc.ir.types import FixedPoint
from qcc.sim.interpreter import run_model

KEEP_INPUT = ("Relu", "MaxPool", "GlobalMaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
              "Dropout", "Transpose")


def _frac(absmax: float, bits: int) -> int:
    if absmax <= 0:
        return bits - 2
    return bits - 1 - math.floor(math.log2(absmax)) - 1


def annotate_fixed(model: Model, calib: dict[str, np.ndarray], act_bits: int = 16, w_bits: int | None = None,
                   jitter: int = 0, seed: int = 0) -> Model:
    w_bits = w_bits or act_bits
    rng = np.random.default_rng(seed)
    absmax: dict[int, float] = {}

    def observe(value: Value, array: np.ndarray) -> None:
        absmax[id(value)] = max(absmax.get(id(value), 0.0), float(np.max(np.abs(array))))

    run_model(model, calib, observer=observe)
    graph = model.graph

    def fresh(value: Value, bits: int) -> FixedPoint:
        frac = _frac(absmax.get(id(value), 1.0), bits)
        if jitter:
            frac -= int(rng.integers(0, jitter + 1))
        return FixedPoint(bits, frac, "trunc")

    for value in graph.inputs:
        value.quant = fresh(value, act_bits)
    for node in graph.nodes:
        x = node.inputs[0]
        out = node.outputs[0]
        if node.op in KEEP_INPUT and x is not None and isinstance(x.quant, FixedPoint):
            out.quant = x.quant
        else:
            out.quant = fresh(out, act_bits)
        for i, param in enumerate(node.inputs[1:], start=1):
            if param is None or param.const is None or param.quant is not None:
                continue
            if node.op in ("Conv", "Dense") and i == 1:
                param.quant = FixedPoint(w_bits, _frac(float(np.max(np.abs(param.const))), w_bits))
                assert x is not None and isinstance(x.quant, FixedPoint)
                limit = x.quant.frac + param.quant.frac
                if out.quant.frac > limit:
                    out.quant = FixedPoint(act_bits, limit, "trunc")
            elif node.op in ("Conv", "Dense") and i == 2:
                pass
            elif node.op not in ("BatchNorm",):
                param.quant = FixedPoint(act_bits, _frac(float(np.max(np.abs(param.const))), act_bits))
        if node.op in ("Conv", "Dense") and len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = node.inputs[2]
            assert isinstance(out.quant, FixedPoint)
            bias.quant = FixedPoint(act_bits, out.quant.frac)
    return model
