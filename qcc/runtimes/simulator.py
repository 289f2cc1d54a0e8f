"""qcc's own simulator as a runtime: for what has no other runtime here (.pt2, a .nnb without
nnablart, an in-memory model)."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.core import Model
from qcc.runtimes.base import EXACT, Runtime, Tolerance
from qcc.sim.interpreter import runner_for


class SimRuntime(Runtime):
    """A Model run by qcc.sim (quantized: the annotations simulated, bit-exact for fixed point)."""

    def __init__(self, model: Model, quantized: bool, name: str, tolerance: Tolerance = EXACT) -> None:
        self.model = model
        self.quantized = quantized
        self.runner = runner_for(model, quantized=quantized)
        self.inputs = tuple(v.name for v in model.graph.inputs)
        self.outputs = tuple(v.name for v in model.graph.outputs)
        shape = model.graph.inputs[0].type.shape if model.graph.inputs else ()
        self.batch = shape[0] if shape and isinstance(shape[0], int) else None
        self.tolerance = tolerance
        self.name = name

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.runner.run(feeds)
        return {k: np.asarray(out[k]) for k in self.outputs}

    def tensors(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        seen: dict[str, np.ndarray] = {}

        def keep(value: Any, array: np.ndarray) -> None:
            seen[value.name] = np.array(array, copy=True)

        runner_for(self.model, quantized=self.quantized, observer=keep).run(feeds)
        return seen
