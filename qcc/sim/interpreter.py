"""The reference interpreter: executes a Model with the schemas' numpy kernels.

`quantized=True` simulates the annotations: every annotated value (weights and activations) is
stored as its type would store it. Fixed-point ops can provide bit-exact integer kernels through
`qcc.sim.fixed` (registered per op); where none exists the float kernel plus storage rounding is
used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError
from qcc.ir.core import Model, Node, Value
from qcc.ir.fakequant import apply_annotation
from qcc.ir.registry import get_schema
from qcc.ir.types import DTYPES

Observer = Callable[[Value, np.ndarray], None]
NodeKernel = Callable[[Node, list[np.ndarray]], list[np.ndarray]]


def check_feeds(model: Model, feeds: dict[str, np.ndarray], source: str = "feeds") -> dict[str, np.ndarray]:
    """Match arrays to graph inputs by name (one array feeds a one-input model whatever its key)."""
    inputs = model.graph.inputs
    if len(inputs) == 1 and len(feeds) == 1 and inputs[0].name not in feeds:
        feeds = {inputs[0].name: next(iter(feeds.values()))}
    out: dict[str, np.ndarray] = {}
    for value in inputs:
        if value.name not in feeds:
            raise InvalidInputError(f"{source}: no array for model input {value.name!r} (got {sorted(feeds)})")
        array = np.asarray(feeds[value.name])
        want = DTYPES[value.type.dtype]
        if array.dtype != want:
            if array.dtype.kind in "fiu" and want.kind == "f":
                array = array.astype(want)
            else:
                raise InvalidInputError(f"{source}: input {value.name!r} has dtype {array.dtype}, model wants {want}")
        if array.ndim != value.type.rank or any(
            isinstance(d, int) and d != s for d, s in zip(value.type.shape, array.shape)
        ):
            raise InvalidInputError(
                f"{source}: input {value.name!r} has shape {array.shape}, model wants {value.type.shape}"
            )
        out[value.name] = array
    return out


class Interpreter:
    def __init__(
        self,
        model: Model,
        quantized: bool = False,
        observer: Observer | None = None,
        kernels: dict[str, NodeKernel] | None = None,
        keep_all: bool = False,
    ) -> None:
        self.model = model
        self.quantized = quantized
        self.observer = observer
        self.kernels = kernels or {}
        self.keep_all = keep_all
        self._consts: dict[int, np.ndarray] = {}
        graph = model.graph
        for value in graph.constants:
            assert value.const is not None
            self._consts[id(value)] = self._store(value, value.const)
        self._last_use: dict[int, int] = {}
        for step, node in enumerate(graph.nodes):
            for operand in node.inputs:
                if operand is not None:
                    self._last_use[id(operand)] = step
        self._schemas = [get_schema(n.op) for n in graph.nodes]

    def _store(self, value: Value, array: np.ndarray) -> np.ndarray:
        if self.quantized and value.quant is not None:
            # FixedPoint.rounding: 'trunc' where the target truncates what it computes (assign-fixed-point)
            return apply_annotation(array, value.quant)
        return array

    def run(self, feeds: dict[str, np.ndarray], outputs: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        graph = self.model.graph
        env: dict[int, np.ndarray] = dict(self._consts)
        for name, array in check_feeds(self.model, feeds).items():
            value = next(v for v in graph.inputs if v.name == name)
            env[id(value)] = self._store(value, array)
            if self.observer:
                self.observer(value, env[id(value)])
        wanted = set(outputs) if outputs is not None else None
        keep = {id(v) for v in graph.outputs}
        if wanted:
            keep |= {id(v) for v in graph.values() if v.name in wanted}
        results: dict[str, np.ndarray] = {}
        for step, (node, schema) in enumerate(zip(graph.nodes, self._schemas)):
            args = [env[id(v)] if v is not None else None for v in node.inputs]
            while args and args[-1] is None:
                args.pop()
            kernel = self.kernels.get(node.op)
            try:
                produced = kernel(node, args) if kernel else schema.kernel(node, args)  # type: ignore[arg-type]
            except (ValueError, IndexError, TypeError, FloatingPointError) as exc:
                raise InvalidInputError(f"node {node.name!r} ({node.op}) failed to execute: {exc}") from None
            for value, array in zip(node.outputs, produced):
                array = self._store(value, np.asarray(array))
                env[id(value)] = array
                if self.observer:
                    self.observer(value, array)
                if self.keep_all or id(value) in keep:
                    results[value.name] = array
            if not self.keep_all:
                for operand in node.inputs:
                    if operand is not None and self._last_use.get(id(operand)) == step and id(operand) not in keep \
                            and id(operand) not in self._consts:
                        env.pop(id(operand), None)
        if wanted is not None:
            return {k: v for k, v in results.items() if k in wanted or k in {o.name for o in graph.outputs}}
        return results if self.keep_all else {v.name: results[v.name] if v.name in results else env[id(v)]
                                              for v in graph.outputs}


def run_model(model: Model, feeds: dict[str, np.ndarray], quantized: bool = False, **kwargs: Any) -> dict[str, np.ndarray]:
    """Run once; returns the graph outputs by name.

    quantized=True on a model whose every activation is FixedPoint (no custom `kernels`) runs the
    bit-exact integer kernels of `qcc.sim.fixed` (what targets c and nnb compute); any other
    annotated model is fake-quantized value by value.
    """
    return _runner(model, quantized, **kwargs).run(feeds)


def _runner(model: Model, quantized: bool, **kwargs: Any) -> Any:
    if quantized and not kwargs.get("kernels"):
        from qcc.sim.fixed import FixedRunner, is_fixed_model

        if is_fixed_model(model):
            return _FixedAdapter(FixedRunner(model, observer=kwargs.get("observer")), kwargs.get("keep_all", False))
    return Interpreter(model, quantized=quantized, **kwargs)


class _FixedAdapter:
    def __init__(self, runner: Any, keep_all: bool) -> None:
        self.runner, self.keep_all = runner, keep_all

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feeds, keep_all=self.keep_all)  # type: ignore[no-any-return]


def run_batched(model: Model, feeds: dict[str, np.ndarray], batch_size: int = 64, quantized: bool = False,
                **kwargs: Any) -> dict[str, np.ndarray]:
    """Run over the first axis in batches and concatenate the outputs."""
    interp = _runner(model, quantized, **kwargs)
    feeds = check_feeds(model, feeds)
    n = len(next(iter(feeds.values()))) if feeds else 0
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        out = interp.run({k: v[start:start + batch_size] for k, v in feeds.items()})
        for key, array in out.items():
            parts.setdefault(key, []).append(array)
    return {k: np.concatenate(v) for k, v in parts.items()}
