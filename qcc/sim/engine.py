"""The one execution loop every simulator runs on: the float interpreter and the integer runners.

A runner says how a value is stored (`store_param`, `store_input`, `store_output`), how a stored
array reads back as float (`to_float`, for observers and results) and which kernel computes each
node (`kernel_for`, resolved once per node at construction, so a run pays no lookup per node).
Kernels have one signature, `kernel(node, arrays) -> arrays`, on stored arrays; observers one,
`observer(value, float_array)`, called for every graph input and node output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import numpy as np

from qcc.errors import InvalidInputError
from qcc.ir.core import Model, Node, Value
from qcc.ir.types import DTYPES

NodeKernel = Callable[[Node, list[np.ndarray]], list[np.ndarray]]
Observer = Callable[[Value, np.ndarray], None]


def check_feeds(model: Model, feeds: dict[str, np.ndarray], source: str = "feeds",
                samples: bool = False) -> dict[str, np.ndarray]:
    """Match arrays to graph inputs by name (one array feeds a one-input model whatever its key).

    `samples`: the arrays are samples-first, to be cut into batches (`qcc.ir.samples`; a static
    batch dimension is checked per batch, not here)."""
    from qcc.ir.samples import sample_axes

    inputs = model.graph.inputs
    axes = sample_axes(model) if samples else {}
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
        shape = value.type.shape
        if samples and value.name in axes:  # samples first (qcc.data.bind_inputs): the model's dims moved
            shape = (shape[axes[value.name]], *(d for i, d in enumerate(shape) if i != axes[value.name]))
        if array.ndim != value.type.rank or any(
            isinstance(d, int) and d != s and not (samples and i == 0)
            for i, (d, s) in enumerate(zip(shape, array.shape))
        ):
            raise InvalidInputError(
                f"{source}: input {value.name!r} has shape {array.shape}, model wants {value.type.shape}"
            )
        out[value.name] = array
    return out


class Runner:
    """Runs a model node by node; parameters are stored once, at construction.

    Subclasses set their own state, then call `Runner.__init__`, which resolves every node's
    kernel and stores the constants through the hooks below.
    """

    holds_floats: ClassVar[bool] = True
    """Stored arrays are float already (no `to_float` needed for observers and results)."""

    def __init__(self, model: Model, observer: Observer | None = None, keep_all: bool = False) -> None:
        self.model = model
        self.observer = observer
        self.keep_all = keep_all
        graph = model.graph
        nodes = graph.nodes
        self._kernels = [self.kernel_for(node) for node in nodes]
        self._consts: dict[int, np.ndarray] = {id(v): self.store_param(v) for v in graph.constants}
        self._inputs = {v.name: v for v in graph.inputs}
        self._values = {v.name: v for v in graph.values()}
        self._operands = [_trimmed(node.inputs) for node in nodes]
        last_use: dict[int, int] = {}
        for step, operands in enumerate(self._operands):
            for operand in operands:
                if operand is not None:
                    last_use[id(operand)] = step
        self._outputs = {id(v) for v in graph.outputs}
        self._dead: list[list[int]] = [[] for _ in nodes]
        for key, step in last_use.items():
            if key not in self._consts and key not in self._outputs:
                self._dead[step].append(key)
        self._notify = self._observing(observer)

    # ------------------------------------------------------------ storage and kernels (subclasses)
    def kernel_for(self, node: Node) -> NodeKernel:
        raise NotImplementedError

    def store_param(self, value: Value) -> np.ndarray:
        raise NotImplementedError

    def store_input(self, value: Value, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def store_output(self, value: Value, array: np.ndarray) -> np.ndarray:
        """What a node output holds once its kernel computed it (integer kernels store already)."""
        return array

    def to_float(self, value: Value, array: np.ndarray) -> np.ndarray:
        return array

    # ------------------------------------------------------------ running
    def run_stored(self, feeds: dict[str, np.ndarray], *, outputs: Iterable[str] | None = None,
                   keep_all: bool | None = None) -> dict[str, np.ndarray]:
        """Stored arrays of the graph outputs, plus the values named in `outputs` (or every node
        output with keep_all), in the order they were computed."""
        keep_all = self.keep_all if keep_all is None else keep_all
        graph = self.model.graph
        env: dict[int, np.ndarray] = dict(self._consts)
        notify = self._notify
        for name, array in check_feeds(self.model, feeds).items():
            value = self._inputs[name]
            env[id(value)] = stored = self.store_input(value, array)
            if notify is not None:
                notify(value, stored)
        wanted = set(outputs) if outputs is not None else set()
        keep = self._outputs | {id(v) for v in graph.values() if v.name in wanted} if wanted else self._outputs
        results: dict[str, np.ndarray] = {}
        store = self.store_output
        for node, kernel, operands, dead in zip(graph.nodes, self._kernels, self._operands, self._dead):
            args = [env[id(v)] if v is not None else None for v in operands]
            try:
                produced = kernel(node, args)  # type: ignore[arg-type]
            except (ValueError, IndexError, TypeError, FloatingPointError) as exc:
                raise InvalidInputError(f"node {node.name!r} ({node.op}) failed to execute: {exc}") from None
            for value, array in zip(node.outputs, produced):
                env[id(value)] = array = store(value, array)
                if notify is not None:
                    notify(value, array)
                if keep_all or id(value) in keep:
                    results[value.name] = array
            if not keep_all:
                for key in dead:
                    if key not in keep:
                        env.pop(key, None)
        if not keep_all and not wanted:
            return {v.name: env[id(v)] for v in graph.outputs}
        for value in graph.outputs:
            results.setdefault(value.name, env[id(value)])
        return results

    def run(self, feeds: dict[str, np.ndarray], *, outputs: Iterable[str] | None = None,
            keep_all: bool | None = None) -> dict[str, np.ndarray]:
        """Like `run_stored`, every array read back as float."""
        stored = self.run_stored(feeds, outputs=outputs, keep_all=keep_all)
        if self.holds_floats:
            return stored
        return {name: self.to_float(self._values[name], array) for name, array in stored.items()}

    def _observing(self, observer: Observer | None) -> Observer | None:
        if observer is None or self.holds_floats:
            return observer

        def notify(value: Value, array: np.ndarray) -> None:
            observer(value, self.to_float(value, array))

        return notify


def _trimmed(inputs: Sequence[Value | None]) -> tuple[Value | None, ...]:
    """A node's operands without trailing missing optionals (kernels see only what is given)."""
    end = len(inputs)
    while end and inputs[end - 1] is None:
        end -= 1
    return tuple(inputs[:end])
