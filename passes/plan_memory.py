"""`plan-memory`: plan every activation buffer and store the plan for the backends.

The plan lives in `model.products` (a `MemoryPlan`); the verifier re-checks it after every later
pass while the graph is unchanged, and treats it as stale (unusable) once the graph changes.
"""

from __future__ import annotations

from typing import Literal

import attrs

from qcc.ir.core import Model
from qcc.plan.liveness import LivenessAnalysis
from qcc.plan.memory_plan import PlanOptions, graph_fingerprint, plan_storage
from qcc.pm.base import ALL, Pass, PassContext, PassResult


@attrs.frozen
class PlanMemory(Pass):
    """Plan activation buffers (arena offsets and/or shared objects), verified against the bounds."""

    name = "plan-memory"
    late = True

    kind: Literal["arena", "shared", "both"] = attrs.field(
        default="both", metadata={"help": "arena (C backend), shared (.nnb) or both"})
    alignment: int = attrs.field(default=16, metadata={"help": "arena offset alignment in bytes"})
    aliases: bool = attrs.field(default=False, metadata={"help": "view ops share their input's buffer"})
    inplace: bool = attrs.field(default=False, metadata={"help": "elementwise ops overwrite a dying input"})
    scheme: str = attrs.field(default="", metadata={"help": "size tensors as this scheme stores them ('' = IR types)"})
    time_budget: float = attrs.field(default=1.0, metadata={"help": "seconds per exact search"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        options = PlanOptions(self.kind, self.alignment, self.aliases, self.inplace, self.scheme, self.time_budget)
        storage = ctx.analyses.get(LivenessAnalysis, model).storage(options.storage)
        plan = plan_storage(storage, options, graph_fingerprint(model.graph))
        model.products.put(plan)
        return PassResult(model, True, frozenset({ALL}))
