"""Value / Node / Graph / Model: the framework-neutral IR.

Identity semantics (attrs eq=False): two values are the same tensor only if they are the same
object. Use-lists are kept in sync by the only methods that change a node's inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import attrs
import numpy as np
from attrs import field

from qcc.ir.types import QuantType, TensorType, dtype_of


@attrs.define(eq=False, repr=False)
class Value:
    """A tensor: graph input, constant (parameter) or node output."""

    name: str
    type: TensorType
    const: np.ndarray | None = None
    quant: QuantType | None = None
    meta: dict[str, Any] = field(factory=dict)
    _producer: Node | None = field(default=None, alias="_producer")
    _uses: list[tuple[Node, int]] = field(factory=list, alias="_uses")

    @classmethod
    def constant(cls, name: str, data: np.ndarray) -> Value:
        data = np.ascontiguousarray(data)
        return cls(name, TensorType(dtype_of(data), tuple(int(d) for d in data.shape)), const=data)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def producer(self) -> Node | None:
        return self._producer

    def uses(self) -> list[tuple[Node, int]]:
        return list(self._uses)

    def consumers(self) -> list[Node]:
        seen: dict[int, Node] = {}
        for node, _ in self._uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def replace_all_uses_with(self, other: Value, graph: Graph | None = None) -> None:
        """Rewire every consumer (and, given the graph, graph outputs) from self to other."""
        for node, index in list(self._uses):
            node.set_input(index, other)
        if graph is not None:
            graph.outputs = [other if v is self else v for v in graph.outputs]

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"<Value {kind}{self.name}: {self.type}>"


@attrs.define(eq=False, repr=False)
class Node:
    """One operation. Create with `Graph.add_node` (or `Node.create` + `Graph.insert_*`)."""

    op: str
    name: str
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(factory=dict)
    meta: dict[str, Any] = field(factory=dict)

    @classmethod
    def create(
        cls,
        op: str,
        inputs: Iterable[Value | None],
        outputs: Iterable[Value],
        attributes: dict[str, Any] | None = None,
        name: str = "",
    ) -> Node:
        node = cls(op, name, tuple(inputs), tuple(outputs), dict(attributes or {}))
        for index, value in enumerate(node.inputs):
            if value is not None:
                value._uses.append((node, index))
        for value in node.outputs:
            if value._producer is not None and value._producer is not node:
                raise ValueError(f"value {value.name!r} already has a producer")
            value._producer = node
        return node

    def set_input(self, index: int, value: Value | None) -> None:
        old = self.inputs[index]
        if old is value:
            return
        if old is not None:
            old._uses.remove((self, index))
        if value is not None:
            value._uses.append((self, index))
        self.inputs = (*self.inputs[:index], value, *self.inputs[index + 1 :])

    def detach(self) -> None:
        """Drop this node's uses of its inputs and its claim on its outputs."""
        for index in range(len(self.inputs)):
            self.set_input(index, None)
        for value in self.outputs:
            if value._producer is self:
                value._producer = None

    def input(self, index: int) -> Value:
        value = self.inputs[index] if index < len(self.inputs) else None
        if value is None:
            raise IndexError(f"node {self.name!r} ({self.op}) has no input {index}")
        return value

    def __repr__(self) -> str:
        return f"<Node {self.name} = {self.op}>"


@attrs.define(eq=False, repr=False)
class Graph:
    """Inputs, outputs, constants and nodes in execution order."""

    name: str = "graph"
    inputs: list[Value] = field(factory=list)
    outputs: list[Value] = field(factory=list)
    constants: list[Value] = field(factory=list)
    nodes: list[Node] = field(factory=list)
    _names: set[str] = field(factory=set, alias="_names")
    _node_names: set[str] = field(factory=set, alias="_node_names")
    _counter: Iterator[int] = field(factory=itertools.count, alias="_counter")

    def __deepcopy__(self, memo: dict[int, Any]) -> Graph:
        """An independent copy built value by value in graph order: the default deep copy follows
        producers and use-lists recursively, which exceeds Python's recursion limit on deep graphs
        (a ViT, a ResNet)."""
        import copy

        new = Graph(self.name, _names=set(self._names), _node_names=set(self._node_names),
                    _counter=copy.deepcopy(self._counter))
        memo[id(self)] = new

        def clone(value: Value) -> Value:
            if id(value) not in memo:
                memo[id(value)] = Value(value.name, value.type, copy.deepcopy(value.const, memo), value.quant,
                                        copy.deepcopy(value.meta, memo))
            copied: Value = memo[id(value)]
            return copied

        new.inputs = [clone(v) for v in self.inputs]
        new.constants = [clone(v) for v in self.constants]
        for node in self.nodes:
            inputs = [clone(v) if v is not None else None for v in node.inputs]
            copied = Node.create(node.op, inputs, [clone(v) for v in node.outputs], copy.deepcopy(node.attrs, memo),
                                 node.name)
            copied.meta = copy.deepcopy(node.meta, memo)
            memo[id(node)] = copied
            new.nodes.append(copied)
        new.outputs = [clone(v) for v in self.outputs]
        return new

    # ------------------------------------------------------------------ naming
    def unique_name(self, base: str, node: bool = False) -> str:
        """A value (or node) name not used yet in this graph, derived from `base`."""
        if not self._names and not self._node_names:
            self._reindex_names()
        taken = self._node_names if node else self._names
        name = base
        while name in taken:
            name = f"{base}_{next(self._counter)}"
        taken.add(name)
        return name

    def _reindex_names(self) -> None:
        self._names.update(v.name for v in self.values())
        self._node_names.update(n.name for n in self.nodes)

    # ------------------------------------------------------------------ building
    def add_input(self, name: str, ttype: TensorType) -> Value:
        value = Value(name, ttype)
        self._names.add(name)
        self.inputs.append(value)
        return value

    def add_constant(self, name: str, data: np.ndarray) -> Value:
        value = Value.constant(name, data)
        self._names.add(name)
        self.constants.append(value)
        return value

    def make_node(
        self,
        op: str,
        inputs: Iterable[Value | None],
        attributes: dict[str, Any] | None = None,
        name: str | None = None,
        num_outputs: int | None = None,
        output_names: Iterable[str] | None = None,
    ) -> Node:
        """Create a node with inferred output types (not yet placed in the node list)."""
        from qcc.ir.registry import get_schema

        schema = get_schema(op)
        node_name = self.unique_name(name or op.lower(), node=True)
        inputs = tuple(inputs)
        attributes = schema.complete_attrs(dict(attributes or {}), node_name)
        out_types = schema.infer_types(inputs, attributes, node_name, num_outputs)
        names = list(output_names) if output_names is not None else None
        outputs = []
        for i, ttype in enumerate(out_types):
            base = names[i] if names is not None else (node_name if len(out_types) == 1 else f"{node_name}_out{i}")
            outputs.append(Value(base if names is not None else self.unique_name(base), ttype))
        if names is not None:
            self._names.update(names)
        return Node.create(op, inputs, outputs, attributes, node_name)

    def add_node(self, op: str, inputs: Iterable[Value | None], attributes: dict[str, Any] | None = None,
                 name: str | None = None, **kwargs: Any) -> Node:
        node = self.make_node(op, inputs, attributes, name, **kwargs)
        self.nodes.append(node)
        return node

    def add(self, op: str, *inputs: Value | None, name: str | None = None, **attributes: Any) -> Value:
        """Append a single-output node and return its output (builder shorthand)."""
        return self.add_node(op, inputs, attributes, name).outputs[0]

    # ------------------------------------------------------------------ queries
    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.constants
        for node in self.nodes:
            yield from node.outputs

    def value_map(self) -> dict[str, Value]:
        return {v.name: v for v in self.values()}

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def index_of(self, node: Node) -> int:
        for i, candidate in enumerate(self.nodes):
            if candidate is node:
                return i
        raise ValueError(f"node {node.name!r} is not in graph {self.name!r}")

    # ------------------------------------------------------------------ mutation
    def insert_after(self, anchor: Node | None, node: Node) -> Node:
        """Place `node` right after `anchor` (None: at the front)."""
        position = 0 if anchor is None else self.index_of(anchor) + 1
        self.nodes.insert(position, node)
        return node

    def insert_before(self, anchor: Node, node: Node) -> Node:
        self.nodes.insert(self.index_of(anchor), node)
        return node

    def remove(self, node: Node) -> None:
        """Remove a node whose outputs are no longer used."""
        for value in node.outputs:
            if value._uses or any(v is value for v in self.outputs):
                raise ValueError(f"cannot remove node {node.name!r}: output {value.name!r} is still used")
        self.nodes = [n for n in self.nodes if n is not node]
        node.detach()

    def sort(self) -> Graph:
        """Stable topological sort (keeps the current order where it is already valid)."""
        from qcc.errors import CycleError

        position = {id(n): i for i, n in enumerate(self.nodes)}
        pending: dict[int, int] = {}
        users: dict[int, list[Node]] = {}
        for node in self.nodes:
            preds = {id(v.producer()) for v in node.inputs if v is not None and v.producer() is not None}
            preds.discard(id(node))
            pending[id(node)] = len(preds)
            for pred in preds:
                users.setdefault(pred, []).append(node)
        import heapq

        ready = [(position[id(n)], n) for n in self.nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        ordered: list[Node] = []
        while ready:
            _, node = heapq.heappop(ready)
            ordered.append(node)
            for user in users.get(id(node), []):
                pending[id(user)] -= 1
                if pending[id(user)] == 0:
                    heapq.heappush(ready, (position[id(user)], user))
        if len(ordered) != len(self.nodes):
            stuck = [n.name for n in self.nodes if pending[id(n)] > 0][:5]
            raise CycleError(f"graph {self.name!r} has a cycle through nodes {stuck}")
        self.nodes = ordered
        return self

    def cleanup(self) -> Graph:
        """Drop nodes and constants that no graph output depends on (chainable)."""
        live: set[int] = {id(v) for v in self.outputs}
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(id(v) in live for v in node.outputs):
                kept.append(node)
                live.update(id(v) for v in node.inputs if v is not None)
            else:
                node.detach()
        self.nodes = kept[::-1]
        self.constants = [c for c in self.constants if id(c) in live or c._uses]
        return self


T = TypeVar("T")


class Products:
    """What passes and frontends leave on a model for later stages, one entry per class.

    Entries are keyed by their type, never by a string: `model.products.put(plan)`, then
    `model.products.get(MemoryPlan)` (typed: a `MemoryPlan | None`). The class's docstring
    documents the entry; the IR needs to know none of them. Statistics that a changed graph makes
    stale belong in the pass manager's analyses instead (calibration statistics are one).
    """

    def __init__(self) -> None:
        self._items: dict[type, Any] = {}

    def put(self, item: object) -> None:
        self._items[type(item)] = item

    def get(self, kind: type[T]) -> T | None:
        return self._items.get(kind)  # type: ignore[no-any-return]

    def __getitem__(self, kind: type[T]) -> T:
        if kind not in self._items:
            raise KeyError(f"no {kind.__name__} on this model")
        return self._items[kind]  # type: ignore[no-any-return]

    def pop(self, kind: type[T]) -> T | None:
        return self._items.pop(kind, None)  # type: ignore[no-any-return]

    def __contains__(self, kind: type) -> bool:
        return kind in self._items

    def kinds(self) -> list[type]:
        return list(self._items)


@attrs.define(eq=False, repr=False)
class Model:
    """A graph plus what passes produce for backends (typed `products`) and metadata."""

    graph: Graph
    metadata: dict[str, Any] = field(factory=dict)
    products: Products = field(factory=Products)

    @property
    def passes_run(self) -> list[str]:
        history: list[str] = self.metadata.setdefault("qcc.passes", [])
        return history

    def __repr__(self) -> str:
        g = self.graph
        return f"<Model {g.name}: {len(g.inputs)} inputs, {len(g.nodes)} nodes, {len(g.outputs)} outputs>"
