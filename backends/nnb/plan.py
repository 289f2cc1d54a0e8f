"""Activation buffers for a lowered program: lifetimes by function index and a shared-object plan.

nnabla-c-runtime mallocs each buffer separately, so a plan is a buffer id per activation and the
cost is the sum of the buffer sizes (version 2: elements of 4 bytes; version 3: bytes).

Lifetimes are inclusive function indices: graph inputs from 0, graph outputs to the end. Unlike
nnabla's converter, qcc lets storage be shared where the runtime's kernels allow it:
- a Reshape whose output is stored like its input copies each element onto itself, so the two
  variables share one buffer for the union of their lifetimes (an alias);
- an element-wise function (y[i] computed from x[i] only, checked in the runtime's sources)
  writes over an input of the same element type and size that dies there (in place), except a
  graph input (the caller's data stays intact) and a parameter.
The planner is qcc's `plan_shared`; `nnabla_plan` is nnabla's own policy on the same program,
kept for comparison and for `--plan nnabla`.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from qcc.ir.core import Model
from qcc.plan import Buffer, SharedPlan, nnabla_shared_plan, plan_shared

from .program import NFunc, NVar, Program

# Functions whose kernels compute y[i] from the inputs' element i only (same index when the
# input has the output's shape): safe to run with y in an input's buffer.
INPLACE_SAFE = frozenset({
    "ReLU", "LeakyReLU", "Sigmoid", "Tanh", "ELU", "Swish", "Abs", "Exp", "Log", "Identity",
    "AddScalar", "MulScalar", "RSubScalar", "RDivScalar", "PowScalar", "RPowScalar",
    "MaximumScalar", "MinimumScalar", "Add2", "Sub2", "Mul2", "Div2", "Pow2", "Maximum2",
    "Minimum2", "BatchNormalization", "Reshape",
})  # fmt: skip


@attrs.frozen
class BufferPlan:
    """A buffer index per activation (by position in the program) and each buffer's size."""

    buffer_of: dict[int, int]  # id(NVar) -> buffer
    sizes: tuple[int, ...]  # in the file's unit (version 2: elements, 3: bytes)
    version: int
    method: str
    lower_bound: int  # LB for shared objects on the same lifetimes, same unit

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes) * (4 if self.version == 2 else 1)


@attrs.frozen
class Lifetimes:
    """Storage groups (aliases and in-place results share one) with inclusive lifetimes."""

    group_of: dict[int, int]  # id(NVar) -> group index
    groups: tuple[Buffer, ...]  # one per group, named by its first variable
    members: tuple[tuple[NVar, ...], ...]


def lifetimes(program: Program, version: int, share: bool = True) -> Lifetimes:
    """Lifetimes of the program's activations; `share=False` gives nnabla's (no sharing)."""
    steps = len(program.functions)
    acts = [v for v in program.variables if not v.is_param]
    first = {id(v): 0 for v in program.inputs}
    last = dict(first)
    for step, fn in enumerate(program.functions):
        for v in fn.inputs:
            if not v.is_param:
                last[id(v)] = step
        for v in fn.outputs:
            first.setdefault(id(v), step)
            last[id(v)] = max(last.get(id(v), step), step)
    for v in program.outputs:
        last[id(v)] = steps
    live = [v for v in acts if id(v) in first]
    parent: dict[int, int] = {}

    def find(key: int) -> int:
        while key in parent:
            key = parent[key]
        return key

    span = {id(v): [first[id(v)], last[id(v)], v.nbytes(version)] for v in live}
    inputs = {id(v) for v in program.inputs}
    outputs = {id(v) for v in program.outputs}
    if share:
        for step, fn in enumerate(program.functions):
            target = _shared_input(fn, step, span, find, inputs, outputs)
            if target is not None:
                out, root = id(fn.outputs[0]), find(target)
                parent[out] = root
                lo, hi, size = span[out]
                span[root] = [min(span[root][0], lo), max(span[root][1], hi), max(span[root][2], size)]
    roots: dict[int, int] = {}
    groups: list[Buffer] = []
    members: list[list[NVar]] = []
    group_of: dict[int, int] = {}
    for v in live:
        root = find(id(v))
        if root not in roots:
            roots[root] = len(groups)
            lo, hi, size = span[root]
            groups.append(Buffer(v.name, size, lo, hi))
            members.append([])
        group_of[id(v)] = roots[root]
        members[roots[root]].append(v)
    return Lifetimes(group_of, tuple(groups), tuple(tuple(m) for m in members))


def _shared_input(fn: NFunc, step: int, span: dict[int, list[int]], find: Any, inputs: set[int],
                  outputs: set[int]) -> int | None:
    """The input whose buffer `fn`'s output may take, if any."""
    if fn.kind not in INPLACE_SAFE or len(fn.outputs) != 1:
        return None
    out = fn.outputs[0]
    for v in fn.inputs:
        if v.is_param or id(v) in inputs or id(v) not in span:
            continue
        if v.storage.dtype != out.storage.dtype or v.size != out.size:
            continue
        root = find(id(v))
        if fn.kind == "Reshape" and v.storage == out.storage and id(out) not in outputs:
            return id(v)  # same bytes: a true alias, both stay readable
        if span[root][1] == step and id(v) not in outputs and root not in outputs:
            return id(v)
    return None


def plan_buffers(program: Program, version: int, external: tuple[dict[str, int], str] | None = None) -> BufferPlan:
    """qcc's plan: plan_shared on the sharing lifetimes, or `external` (a plan-memory assignment,
    tensor name -> object) when it is valid for this program and no larger."""
    life = lifetimes(program, version, share=True)
    if not life.groups:
        return BufferPlan({}, (), version, "empty", 0)
    own = _assemble(life, plan_shared(life.groups), version)
    if external is not None:
        plan = _from_external(life, version, *external)
        if plan is not None and plan.total_bytes <= own.total_bytes:
            return attrs.evolve(plan, lower_bound=own.lower_bound)
    return own


def external_assignment(model: Model) -> tuple[dict[str, int], str] | None:
    """The shared-object assignment of the model's current `plan-memory` product, by tensor."""
    from qcc.plan.memory_plan import current_plan

    plan = current_plan(model)
    if plan is None or plan.shared is None:
        return None
    shared = plan.shared
    return {t: shared.assignment[b] for t, b in plan.buffer_of.items()}, shared.method


def nnabla_plan(program: Program, version: int) -> BufferPlan:
    """nnabla's converter policy (save_variable_buffer.py) on this program's lifetimes."""
    life = lifetimes(program, version, share=False)
    if not life.groups:
        return BufferPlan({}, (), version, "nnabla", 0)
    return _assemble(life, nnabla_shared_plan(life.groups), version)


def _assemble(life: Lifetimes, shared: SharedPlan, version: int) -> BufferPlan:
    buffer_of = {}
    for index, group in enumerate(life.groups):
        for v in life.members[index]:
            buffer_of[id(v)] = shared.assignment[group.name]
    return BufferPlan(buffer_of, tuple(int(s) for s in shared.buffer_sizes), version, shared.method,
                      int(shared.lower_bound))


def _from_external(life: Lifetimes, version: int, assignment: dict[str, int], method: str) -> BufferPlan | None:
    """The assignment, if every activation has an object and no two groups sharing one are
    live at the same time; None otherwise (e.g. conversions qcc added, or coarser lifetimes)."""
    group_buffer: dict[int, int] = {}
    for index, members in enumerate(life.members):
        ids = {assignment.get(v.source.name) if v.source is not None else None for v in members}
        if len(ids) != 1 or None in ids:
            return None
        group_buffer[index] = int(next(iter(ids)))  # type: ignore[arg-type]
    by_buffer: dict[int, list[Buffer]] = {}
    for index, buf in group_buffer.items():
        by_buffer.setdefault(buf, []).append(life.groups[index])
    for bufs in by_buffer.values():
        bufs.sort(key=lambda b: b.first)
        if any(a.last >= b.first for a, b in itertools.pairwise(bufs)):
            return None
    renumber = {buf: n for n, buf in enumerate(sorted(by_buffer))}
    sizes = [0] * len(renumber)
    for buf, bufs in by_buffer.items():
        sizes[renumber[buf]] = max(b.size for b in bufs)
    buffer_of = {id(v): renumber[group_buffer[index]] for index, members in enumerate(life.members)
                 for v in members}
    return BufferPlan(buffer_of, tuple(sizes), version, f"plan-memory ({method})", 0)
