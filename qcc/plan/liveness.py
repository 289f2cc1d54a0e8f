"""Liveness: which activation needs storage from which step to which, in the execution order.

Step i is `graph.nodes[i]`. A tensor lives from its producer's step (graph inputs: 0) to its last
consumer's step (graph outputs: the last step), inclusive, so an op's inputs and outputs never
share storage unless an option says so:
- `aliases`: ops with the schema trait 'view' (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
  Dropout) store their output in their input's buffer;
- `inplace`: an op with the trait 'elementwise' writes its output over an input of the same
  shape and size that dies at that op (and is not a graph output).
Both are per-backend capabilities, off by default. Constants are parameters, never buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.plan.intervals import Buffer
from qcc.plan.sizing import Sizer, scheme_sizer
from qcc.pm.base import Analysis, AnalysisManager


@attrs.frozen
class StorageOptions:
    """What the target's kernels allow, and how tensors are sized ("" = as the IR declares)."""

    aliases: bool = False
    inplace: bool = False
    scheme: str = ""


NO_SHARING = StorageOptions()


@attrs.frozen(eq=False)
class Storage:
    """Buffers to plan (one per storage group) and each activation's own lifetime and group.

    `tensors` are the activations' lifetimes before grouping, in definition order (graph inputs,
    then node outputs); `buffers` follow the same order by their first member, whose name they
    carry; `buffer_of` maps every activation to its buffer's name.
    """

    steps: int
    tensors: tuple[Buffer, ...]
    buffers: tuple[Buffer, ...]
    buffer_of: dict[str, str]
    options: StorageOptions

    @property
    def shared_count(self) -> int:
        """Activations that need no buffer of their own (views and in-place results)."""
        return len(self.tensors) - len(self.buffers)


def compute_storage(
    graph: Graph,
    options: StorageOptions = NO_SHARING,
    order: Sequence[Node] | None = None,
    sizer: Sizer | None = None,
) -> Storage:
    """Lifetimes and storage groups for `order` (default: the graph's node order)."""
    nodes = graph.nodes if order is None else order
    size_of = sizer or scheme_sizer(options.scheme)
    end = max(len(nodes) - 1, 0)
    values: dict[int, Value] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for value in graph.inputs:
        values[id(value)] = value
        first[id(value)] = last[id(value)] = 0
    for step, node in enumerate(nodes):
        for operand in node.inputs:
            if operand is not None and id(operand) in values:
                last[id(operand)] = step
        for value in node.outputs:
            values[id(value)] = value
            first[id(value)] = last[id(value)] = step
    pinned = {id(v) for v in graph.outputs if id(v) in values}
    for key in pinned:
        last[key] = end
    sizes = {key: size_of(value) for key, value in values.items()}

    groups = _Groups(first, last, sizes, pinned)
    if options.aliases or options.inplace:
        for step, node in enumerate(nodes):
            target = _shares_with(node, step, options, groups, values, sizes)
            if target is not None:
                groups.join(id(node.outputs[0]), target)

    tensors = tuple(Buffer(v.name, sizes[k], first[k], last[k]) for k, v in values.items())
    buffers = []
    buffer_of = {}
    for key, value in values.items():
        root = groups.find(key)
        buffer_of[value.name] = values[root].name
        if root == key:
            buffers.append(Buffer(value.name, groups.size[key], groups.first[key], groups.last[key]))
    return Storage(len(nodes), tensors, tuple(buffers), buffer_of, options)


def _shares_with(
    node: Node,
    step: int,
    options: StorageOptions,
    groups: _Groups,
    values: dict[int, Value],
    sizes: dict[int, int],
) -> int | None:
    """The activation whose buffer this node's output reuses, if any."""
    if len(node.outputs) != 1:
        return None
    schema = get_schema(node.op)
    out = node.outputs[0]
    if options.aliases and schema.has("view"):
        source = node.inputs[0] if node.inputs else None
        return id(source) if source is not None and id(source) in values else None
    if options.inplace and schema.has("inplace"):
        for source in node.inputs:
            if source is None or id(source) not in values:
                continue
            root = groups.find(id(source))
            if (
                source.type.shape == out.type.shape
                and sizes[id(source)] == sizes[id(out)] == groups.size[root]
                and groups.last[root] == step
                and not groups.pinned[root]
            ):
                return id(source)
    return None


class _Groups:
    """Union-find over activations; each root keeps its group's lifetime, size and pinning."""

    def __init__(
        self, first: dict[int, int], last: dict[int, int], sizes: dict[int, int], pinned: set[int]
    ) -> None:
        self.parent: dict[int, int] = {}
        self.first = dict(first)
        self.last = dict(last)
        self.size = dict(sizes)
        self.pinned = {key: key in pinned for key in first}

    def find(self, key: int) -> int:
        root = key
        while root in self.parent:
            root = self.parent[root]
        while key != root:  # path compression
            nxt = self.parent[key]
            self.parent[key] = root
            key = nxt
        return root

    def join(self, member: int, into: int) -> None:
        """Merge `member`'s group into the group of `into` (whose root keeps the name)."""
        a, b = self.find(member), self.find(into)
        if a == b:
            return
        self.parent[a] = b
        self.first[b] = min(self.first[a], self.first[b])
        self.last[b] = max(self.last[a], self.last[b])
        self.size[b] = max(self.size[a], self.size[b])
        self.pinned[b] = self.pinned[a] or self.pinned[b]


class Liveness:
    """The `liveness` analysis result: storage per option set, computed once each."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._cache: dict[StorageOptions, Storage] = {}

    def storage(self, options: StorageOptions = NO_SHARING) -> Storage:
        if options not in self._cache:
            self._cache[options] = compute_storage(self.graph, options)
        return self._cache[options]


class LivenessAnalysis(Analysis):
    """Cached per model; passes that reorder nodes or change types must not preserve it."""

    name = "liveness"

    def compute(self, model: Model, am: AnalysisManager) -> Any:
        return Liveness(model.graph)
