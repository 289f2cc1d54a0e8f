"""Execution orders with a lower peak: LB_off depends on the order, and branchy graphs
(Inception, SqueezeNet, DenseNet blocks) leave room to choose.

Candidates, each scored exactly (LB_off of the order's liveness under the storage options):
- the original order, so the result is never worse;
- list scheduling: repeatedly run the ready node that keeps the running step's live bytes lowest
  (`greedy-peak`) or that frees the most bytes net of what it allocates (`greedy-net`);
- depth-first from the outputs, visiting a node's producers largest (subgraph peak - output)
  first (the Sethi-Ullman / Liu order, optimal on trees);
then a hill climb within the time budget: move a node whose output is live at the peak step to
a random position between its producers and consumers, keep the move if the peak did not rise.
Every node needs its inputs and outputs at once, so the largest such footprint bounds the peak
of any order; the search stops when it reaches it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from qcc.ir.core import Graph, Node, Value
from qcc.ir.registry import get_schema
from qcc.plan.intervals import Buffer, as_arrays, coverage
from qcc.plan.liveness import NO_SHARING, StorageOptions, compute_storage
from qcc.plan.sizing import Sizer, scheme_sizer


@attrs.frozen
class Schedule:
    """The best order found, its LB_off, the original order's and the footprint bound."""

    order: tuple[Node, ...]
    peak: int
    original_peak: int
    bound: int
    method: str


def best_schedule(
    graph: Graph,
    options: StorageOptions = NO_SHARING,
    *,
    time_budget: float = 1.0,
    max_stale: int = 64,
    seed: int = 0,
) -> Schedule:
    """The lowest-peak order among the candidates (the original one on ties).

    The hill climb stops at the bound, at the time budget, or after `max_stale` moves in a row
    that did not lower the peak.
    """
    sizer = scheme_sizer(options.scheme)
    deadline = time.monotonic() + time_budget
    dag = _Dag(graph, sizer)

    def score(order: Sequence[int]) -> tuple[int, int]:
        """(LB_off, the step where it is reached) of an order of node indices."""
        buffers = compute_storage(graph, options, [dag.nodes[i] for i in order], sizer).buffers
        return _peak(buffers)

    original = list(range(len(dag.nodes)))
    bound = footprint_bound(graph, options, sizer)
    best, (peak, _) = original, score(original)
    original_peak, method = peak, "original"
    for name, make in (("greedy-peak", dag.greedy_peak), ("greedy-net", dag.greedy_net),
                       ("depth-first", dag.depth_first)):
        order = make()
        candidate, _ = score(order)
        if candidate < peak:
            best, peak, method = order, candidate, name
    if peak > bound and len(best) > 1:
        climbed, lower = _climb(dag, best, score, bound, deadline, max_stale, seed)
        if lower < peak:
            best, peak, method = climbed, lower, method + "+hill-climb"
    return Schedule(tuple(dag.nodes[i] for i in best), peak, original_peak, bound, method)


def footprint_bound(graph: Graph, options: StorageOptions, sizer: Sizer) -> int:
    """Largest storage one node needs at once (distinct inputs + outputs not sharing an
    input's buffer): no order's LB_off is below it."""
    storage = compute_storage(graph, StorageOptions(aliases=options.aliases, scheme=options.scheme),
                              sizer=sizer)  # view groups do not depend on the order
    sizes = {b.name: b.size for b in storage.buffers}
    best = 0
    for node in graph.nodes:
        groups = {storage.buffer_of[v.name] for v in node.inputs if v is not None and v.name in storage.buffer_of}
        total = sum(sizes[g] for g in groups)
        schema = get_schema(node.op)
        reusable = (options.aliases and schema.has("view")) or (
            options.inplace and schema.has("inplace") and len(node.outputs) == 1
            and any(v is not None and not v.is_const and v.type.shape == node.outputs[0].type.shape
                    and sizer(v) == sizer(node.outputs[0]) for v in node.inputs))
        if not reusable:
            total += sum(sizer(v) for v in node.outputs)
        best = max(best, total)
    return best


def _peak(buffers: Sequence[Buffer]) -> tuple[int, int]:
    if not buffers:
        return 0, 0
    arr = as_arrays(buffers)
    load = coverage(arr, arr.sizes)
    at = int(np.argmax(load))
    return int(load[at]), int(arr.starts[at])


class _Dag:
    """Node indices with producer/consumer lists, bytes allocated and read per node."""

    def __init__(self, graph: Graph, sizer: Sizer) -> None:
        self.nodes = list(graph.nodes)
        index = {id(n): i for i, n in enumerate(self.nodes)}
        n = len(self.nodes)
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        self.out_bytes = [sum(sizer(v) for v in node.outputs) for node in self.nodes]
        self.reads: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (value id, bytes), distinct
        self.readers: dict[int, int] = {}  # value id -> number of reading nodes
        self.pinned = {id(v) for v in graph.outputs}
        self.producer_of: dict[int, int] = {}
        for i, node in enumerate(self.nodes):
            for v in node.outputs:
                self.producer_of[id(v)] = i
            for v in _activations(node):
                self.reads[i].append((id(v), sizer(v)))
                self.readers[id(v)] = self.readers.get(id(v), 0) + 1
                producer = v.producer()
                p = index.get(id(producer)) if producer is not None else None
                if p is not None and p not in self.preds[i]:
                    self.preds[i].append(p)
                    self.succs[p].append(i)
        self.outputs = [self.producer_of[id(v)] for v in graph.outputs if id(v) in self.producer_of]
        self.input_bytes = sum(sizer(v) for v in graph.inputs)

    def _list_schedule(self, key: Callable[[int, int, int], tuple[int, int]]) -> list[int]:
        """Kahn's algorithm choosing by key(live, allocated, freed), ties by original position."""
        waiting = [len(p) for p in self.preds]
        remaining = dict(self.readers)
        ready = [i for i in range(len(self.nodes)) if waiting[i] == 0]
        live = self.input_bytes
        order = []
        while ready:
            pick = min(ready, key=lambda i: (*key(live, self.out_bytes[i], self._freed(i, remaining)), i))
            ready.remove(pick)
            order.append(pick)
            live += self.out_bytes[pick] - self._freed(pick, remaining)
            for v, _ in self.reads[pick]:
                remaining[v] -= 1
            for s in self.succs[pick]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.append(s)
        return order

    def _freed(self, i: int, remaining: dict[int, int]) -> int:
        return sum(b for v, b in self.reads[i] if remaining[v] == 1 and v not in self.pinned)

    def greedy_peak(self) -> list[int]:
        return self._list_schedule(lambda live, alloc, freed: (live + alloc, alloc - freed))

    def greedy_net(self) -> list[int]:
        return self._list_schedule(lambda live, alloc, freed: (alloc - freed, live + alloc))

    def depth_first(self) -> list[int]:
        """Post-order from the outputs; producers with the larger (peak - output) go first."""
        n = len(self.nodes)
        peak = [0] * n
        for i in range(n):  # the node list is topological
            held = top = 0
            for p in sorted(self.preds[i], key=lambda p: self.out_bytes[p] - peak[p]):
                top = max(top, held + peak[p])
                held += self.out_bytes[p]
            peak[i] = max(top, held + self.out_bytes[i])
        done = [False] * n
        order: list[int] = []
        for root in self.outputs:
            stack = [(root, False)]
            while stack:
                i, expanded = stack.pop()
                if done[i]:
                    continue
                if expanded:
                    done[i] = True
                    order.append(i)
                    continue
                stack.append((i, True))
                kids = sorted(self.preds[i], key=lambda p: peak[p] - self.out_bytes[p])
                stack.extend((p, False) for p in kids if not done[p])  # the largest pops first
        return order + [i for i in range(n) if not done[i]]  # nodes no output needs, in order


def _activations(node: Node) -> list[Value]:
    seen: dict[int, Value] = {}
    for v in node.inputs:
        if v is not None and not v.is_const:
            seen.setdefault(id(v), v)
    return list(seen.values())


def _climb(
    dag: _Dag,
    order: list[int],
    score: Callable[[Sequence[int]], tuple[int, int]],
    bound: int,
    deadline: float,
    max_stale: int,
    seed: int,
) -> tuple[list[int], int]:
    """Move producers of tensors live at the peak step within their dependency windows."""
    rng = random.Random(seed)
    peak, step = score(order)
    stale = 0
    while peak > bound and stale < max_stale and time.monotonic() < deadline:
        stale += 1
        position = {node: p for p, node in enumerate(order)}
        live = sorted({dag.producer_of[v] for s in order[step:] for v, _ in dag.reads[s]
                       if v in dag.producer_of and position[dag.producer_of[v]] <= step})
        node = rng.choice(live) if live else order[step]
        rest = [i for i in order if i != node]
        where = {i: p for p, i in enumerate(rest)}
        lo = max((where[q] for q in dag.preds[node]), default=-1) + 1
        hi = min((where[q] for q in dag.succs[node]), default=len(rest))
        at = rng.randint(lo, hi)
        if at == position[node]:
            continue
        moved = [*rest[:at], node, *rest[at:]]
        new_peak, new_step = score(moved)
        if new_peak <= peak:
            if new_peak < peak:
                stale = 0
            order, peak, step = moved, new_peak, new_step
    return order, peak
