"""A small DenseNet for the fold-bn and QDQ tests: light_densenet121's first dense block.

The onnx package's light_densenet121 keeps its real Caffe2-style BatchNorm statistics
(normalize-only BatchNorm with variances down to 1e-12, then Mul/Add "scale layers" with
per-channel constants) and gets seeded random conv weights (tests/onnx_zoo.py). Cut after the
first transition (conv1 + six dense layers + conv2_blk + AveragePool), with a 64x64 input, a
global average pool and a 1x1 Conv head, it has every DenseNet pattern (Concat -> BatchNorm ->
Mul -> Add -> Relu -> Conv, Conv -> BatchNorm -> Mul -> Add -> Relu) and runs in milliseconds.
"""

from __future__ import annotations

import functools

import numpy as np

from tests.onnx_zoo import random_input, randomized_bytes

LAST = "r105"
"""Output of the first transition's AveragePool in light_densenet121."""
INPUT = "data_0"
SIZE = 64
CLASSES = 10


@functools.lru_cache(maxsize=1)
def densenet_block_bytes(seed: int = 0) -> bytes:
    """The cut model at opset 13, input (N, 3, 64, 64), output `logits` (N, 10, 1, 1)."""
    import onnx
    from onnx import helper, numpy_helper, version_converter

    model = onnx.load_from_string(randomized_bytes("densenet121", seed))
    graph = model.graph
    kept = []
    for node in graph.node:
        kept.append(node)
        if LAST in node.output:
            break
    channels = 128  # conv2_blk's output channels
    rng = np.random.default_rng(seed + 1)
    w = (rng.standard_normal((CLASSES, channels, 1, 1)) * 1.4 / np.sqrt(channels)).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, CLASSES).astype(np.float32)
    kept += [helper.make_node("GlobalAveragePool", [LAST], ["pooled"], name="gap"),
             helper.make_node("Conv", ["pooled", "head_w", "head_b"], ["logits"], name="head")]
    used = {name for node in kept for name in node.input}
    inits = [t for t in graph.initializer if t.name in used]
    inits += [numpy_helper.from_array(w, "head_w"), numpy_helper.from_array(b, "head_b")]
    cut = helper.make_graph(
        kept, "densenet_block",
        [helper.make_tensor_value_info(INPUT, onnx.TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", CLASSES, 1, 1])], inits)
    out = helper.make_model(cut, opset_imports=[helper.make_opsetid("", 9)], ir_version=7)
    out = version_converter.convert_version(out, 13)  # per-channel DequantizeLinear needs opset 13
    onnx.checker.check_model(out)
    return bytes(out.SerializeToString())


def densenet_block_data(samples: int, seed: int) -> dict[str, np.ndarray]:
    return {INPUT: random_input((samples, 3, SIZE, SIZE), seed=seed)}
