"""`reorder`: pick the topological order with the lowest peak of live activation bytes.

Run it before `plan-memory` with the same sharing options; it never makes the peak worse (the
original order is one of the candidates) and leaves the graph untouched when nothing is better.
"""

from __future__ import annotations

import attrs

from qcc.ir.core import Model
from qcc.plan.liveness import StorageOptions
from qcc.plan.reorder import best_schedule
from qcc.pm.base import Pass, PassContext, PassResult


@attrs.frozen
class Reorder(Pass):
    """Reorder nodes (a topological order) to lower the peak of live activation bytes (LB_off)."""

    name = "reorder"
    late = True

    aliases: bool = attrs.field(default=False, metadata={"help": "view ops share their input's buffer"})
    inplace: bool = attrs.field(default=False, metadata={"help": "elementwise ops overwrite a dying input"})
    scheme: str = attrs.field(default="", metadata={"help": "size tensors as this scheme stores them ('' = IR types)"})
    time_budget: float = attrs.field(default=1.0, metadata={"help": "seconds for the search"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        options = StorageOptions(self.aliases, self.inplace, self.scheme)
        schedule = best_schedule(model.graph, options, time_budget=self.time_budget)
        ctx.note("reorder", {"original_peak_bytes": schedule.original_peak, "peak_bytes": schedule.peak,
                             "footprint_bound_bytes": schedule.bound, "method": schedule.method})
        if schedule.peak >= schedule.original_peak:
            return PassResult.unchanged(model)
        model.graph.nodes = list(schedule.order)
        return PassResult(model, True, frozenset())
