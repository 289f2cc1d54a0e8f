"""The reference interpreter: executes a Model with the schemas' numpy kernels.

`quantized=True` simulates the annotations: every annotated value (weights and activations) is
stored as its type would store it (fake quantization). `run_model` and `runner_for` pick what a
quantized run means: the bit-exact integer kernels of `qcc.sim.fixed` for a model whose every
activation is FixedPoint stored by truncation (nnabla-c-runtime's arithmetic: the .nnb and C
targets), fake quantization for anything else (a fixed-point model for a rounding runtime
included). All runners share the loop of
`qcc.sim.engine`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.core import Model, Node, Value
from qcc.ir.fakequant import apply_annotation
from qcc.ir.registry import get_schema
from qcc.ir.samples import to_model
from qcc.sim.engine import NodeKernel, Observer, Runner, check_feeds
from qcc.sim.fixed import FixedRunner, runs_integer_kernels

__all__ = ["Interpreter", "NodeKernel", "Observer", "check_feeds", "run_batched", "run_model", "runner_for"]


class Interpreter(Runner):
    """Float kernels (the schemas' or `kernels[op]`), values stored as their annotations read back."""

    def __init__(
        self,
        model: Model,
        quantized: bool = False,
        observer: Observer | None = None,
        kernels: dict[str, NodeKernel] | None = None,
        keep_all: bool = False,
    ) -> None:
        self.quantized = quantized
        self.kernels = kernels or {}
        super().__init__(model, observer, keep_all)

    def kernel_for(self, node: Node) -> NodeKernel:
        return self.kernels.get(node.op) or get_schema(node.op).kernel  # type: ignore[return-value]

    def _store(self, value: Value, array: np.ndarray) -> np.ndarray:
        if self.quantized and value.quant is not None:
            # FixedPoint.rounding: 'trunc' where the target truncates what it computes (assign-fixed-point)
            return apply_annotation(array, value.quant)
        return array

    def store_param(self, value: Value) -> np.ndarray:
        assert value.const is not None
        return self._store(value, value.const)

    def store_input(self, value: Value, array: np.ndarray) -> np.ndarray:
        return self._store(value, array)

    def store_output(self, value: Value, array: np.ndarray) -> np.ndarray:
        return self._store(value, np.asarray(array))


def runner_for(model: Model, quantized: bool = False, **kwargs: Any) -> Runner:
    """The runner `run_model` uses: quantized=True on a model whose every activation is FixedPoint
    stored by truncation (`runs_integer_kernels`; no custom `kernels`) runs the bit-exact integer
    kernels; anything else the interpreter."""
    if quantized and not kwargs.get("kernels") and runs_integer_kernels(model):
        return FixedRunner(model, observer=kwargs.get("observer"), keep_all=kwargs.get("keep_all", False))
    return Interpreter(model, quantized=quantized, **kwargs)


def run_model(model: Model, feeds: dict[str, np.ndarray], quantized: bool = False, **kwargs: Any) -> dict[str, np.ndarray]:
    """Run once; returns the graph outputs by name (float; see `runner_for` for quantized=True)."""
    return runner_for(model, quantized, **kwargs).run(feeds)


def run_batched(model: Model, feeds: dict[str, np.ndarray], batch_size: int = 64, quantized: bool = False,
                **kwargs: Any) -> dict[str, np.ndarray]:
    """Run samples-first `feeds` (`qcc.data.bind_inputs`) in batches; outputs concatenated on axis 0."""
    runner = runner_for(model, quantized, **kwargs)
    feeds = check_feeds(model, feeds, samples=True)
    n = len(next(iter(feeds.values()))) if feeds else 0
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        out = runner.run(to_model(model, {k: v[start:start + batch_size] for k, v in feeds.items()}))
        for key, array in out.items():
            parts.setdefault(key, []).append(array)
    return {k: np.concatenate(v) for k, v in parts.items()}
