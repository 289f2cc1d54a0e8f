"""Test models from the onnx package's light zoo, with seeded random weights.

The light graphs replace every weight with ConstantOfShape(0.02), which makes outputs degenerate;
comparisons are only meaningful once the weights are random, so tests use `randomized(name)`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

LIGHT_NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
               "squeezenet", "vgg19", "zfnet512")


def light_dir() -> Path:
    import onnx

    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def light_path(name: str) -> Path:
    return light_dir() / f"light_{name}.onnx"


@functools.lru_cache(maxsize=2)
def randomized_bytes(name: str, seed: int = 0) -> bytes:
    """The light graph with each ConstantOfShape weight replaced by a seeded random initializer."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(light_path(name)))
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    kept = []
    new_inits = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = [int(d) for d in numpy_helper.to_array(inits[node.input[0]])]
            if len(shape) >= 2:
                fan_in = int(np.prod(shape[1:]))
                data = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.4 / np.sqrt(fan_in))
            else:
                data = rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
            new_inits.append(numpy_helper.from_array(data, node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(new_inits)
    return bytes(model.SerializeToString())


def random_input(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ort_run(model: bytes | str, feeds: dict[str, np.ndarray], optimize: bool = False) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))
