"""Running a model on stored arrays: the loop the bit-exact integer simulators share.

A subclass says how a value is stored (`store_param`, `store_input`), how it reads back as
float (`dequantize`) and which kernel computes each op (`kernels`, `fallback`); kernels have the
`Interpreter(kernels=...)` signature `kernel(node, arrays) -> arrays` on stored arrays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qcc.errors import InvalidInputError
from qcc.ir.core import Model, Node, Value

NodeKernel = Callable[[Node, list[np.ndarray]], list[np.ndarray]]
Observer = Callable[[Value, np.ndarray], None]


class StoredRunner:
    """Runs a model on stored arrays; parameters are stored once at construction."""

    kernels: dict[str, NodeKernel]

    def __init__(self, model: Model, observer: Observer | None = None) -> None:
        self.model = model
        self.observer = observer
        self._consts = {id(v): self.store_param(v) for v in model.graph.constants}
        self._last_use: dict[int, int] = {}
        for step, node in enumerate(model.graph.nodes):
            for value in node.inputs:
                if value is not None:
                    self._last_use[id(value)] = step

    # ------------------------------------------------------------ storage (subclasses)
    def store_param(self, value: Value) -> np.ndarray:
        raise NotImplementedError

    def store_input(self, value: Value, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def dequantize(self, value: Value, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fallback(self, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    # ------------------------------------------------------------ running
    def run_stored(self, feeds: dict[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
        """Stored arrays of the graph outputs (or of every value with keep_all)."""
        from qcc.sim.interpreter import check_feeds

        graph = self.model.graph
        env: dict[int, np.ndarray] = dict(self._consts)
        by_name = {v.name: v for v in graph.inputs}
        for name, array in check_feeds(self.model, feeds).items():
            value = by_name[name]
            env[id(value)] = self.store_input(value, array)
            self._observe(value, env[id(value)])
        keep = {id(v) for v in graph.outputs}
        results: dict[str, np.ndarray] = {}
        for step, node in enumerate(graph.nodes):
            args = [env[id(v)] if v is not None else None for v in node.inputs]
            while args and args[-1] is None:
                args.pop()
            kernel = self.kernels.get(node.op, self.fallback)
            try:
                produced = kernel(node, args)  # type: ignore[arg-type]
            except (ValueError, IndexError, TypeError, FloatingPointError) as exc:
                raise InvalidInputError(f"node {node.name!r} ({node.op}) failed to execute: {exc}") from None
            for value, array in zip(node.outputs, produced):
                env[id(value)] = array
                self._observe(value, array)
                if keep_all:
                    results[value.name] = array
            for used in node.inputs:
                if used is not None and self._last_use.get(id(used)) == step and id(used) not in keep \
                        and id(used) not in self._consts and not keep_all:
                    env.pop(id(used), None)
        for value in graph.outputs:
            results[value.name] = env[id(value)]
        return results

    def run(self, feeds: dict[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
        """Float32 results, dequantized exactly."""
        values = {v.name: v for v in self.model.graph.values()}
        return {name: self.dequantize(values[name], array)
                for name, array in self.run_stored(feeds, keep_all).items()}

    def _observe(self, value: Value, array: np.ndarray) -> None:
        if self.observer is not None:
            self.observer(value, self.dequantize(value, array))
