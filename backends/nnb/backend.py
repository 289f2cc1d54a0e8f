"""The "nnb" target: a .nnb file for nnabla-c-runtime (`qcc compile ... -o model.nnb`).

`--plan qcc` (default): the IR lowered to the runtime's functions, its fixed-point rules enforced
(legalize.py), activations in qcc's shared-object plan (plan.py). `--plan nnabla`: the file
nnabla's own converter writes for the same .nnp and settings (compat.py). Either way the bytes
are checked by the format layer before anything is written, and written atomically.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from qcc.errors import UsageError
from qcc.io import atomic_write_bytes
from qcc.ir.core import Model

from .assemble import assemble
from .format import NnbFile, write_nnb
from .functions import FunctionTable, default_table
from .legalize import legalize
from .plan import BufferPlan, external_assignment, nnabla_plan, plan_buffers
from .program import Program

PLANS = ("qcc", "nnabla")


@attrs.frozen
class NnbResult:
    """What was written, for reports and tests."""

    nnb: NnbFile
    data: bytes
    program: Program | None  # None for --plan nnabla
    plan: str
    plan_method: str  # the planner that placed the buffers
    buffer_bytes: int  # what the runtime mallocs for activations
    nnabla_buffer_bytes: int  # nnabla's reuse policy on the same functions and types
    lower_bound_bytes: int  # no shared-object plan of qcc's lifetimes needs less
    parameter_bytes: int
    notes: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        return {
            "version": self.nnb.version, "api_level": self.nnb.api_level, "plan": self.plan,
            "file_bytes": len(self.data), "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes, "buffers": len(self.nnb.buffers), "plan_method": self.plan_method,
            "nnabla_policy_buffer_bytes": self.nnabla_buffer_bytes, "buffer_lower_bound": self.lower_bound_bytes,
            "functions": len(self.nnb.functions), "variables": len(self.nnb.variables),
            "notes": list(self.notes),
        }  # fmt: skip


def build_nnb(model: Model, nnb_version: int = 3, api: int = 44, plan: str = "qcc",
              settings: str | None = None, batch: int = 1, table: FunctionTable | None = None) -> NnbResult:
    """Lower, check and encode `model` (annotations the rules force may change; see legalize)."""
    if nnb_version not in (2, 3):
        raise UsageError(f"--nnb-version {nnb_version}: choose 2 or 3")
    if plan not in PLANS:
        raise UsageError(f"--plan {plan!r}: choose one of {', '.join(PLANS)}")
    table = table or default_table()
    level = table.check_level(api)
    if plan == "nnabla":
        from .compat import nnabla_compatible

        nnb = nnabla_compatible(model, nnb_version, level, settings, batch, table)
        data = write_nnb(nnb, table)
        own = _buffer_bytes(nnb)
        return NnbResult(nnb, data, None, plan, "nnabla", own, own, 0, _param_bytes(nnb))
    if settings is not None:
        _apply_settings(model, settings)
    program, notes = legalize(model, batch)
    buffers = plan_buffers(program, nnb_version, external_assignment(model))
    reference: BufferPlan = nnabla_plan(program, nnb_version)
    nnb = assemble(program, buffers, nnb_version, level, table)
    data = write_nnb(nnb, table)
    unit = 4 if nnb_version == 2 else 1
    return NnbResult(nnb, data, program, plan, buffers.method, buffers.total_bytes, reference.total_bytes,
                     buffers.lower_bound * unit, _param_bytes(nnb), tuple(notes))


def _apply_settings(model: Model, path: str) -> None:
    """Pin a settings.yaml's types unless the pipeline already did (values carry `pinned`)."""
    if any(v.meta.get("pinned") for v in model.graph.values()):
        return
    from qcc.settings_yaml import apply_settings

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read settings: {exc}") from None
    apply_settings(model, text, path)


def _buffer_bytes(nnb: NnbFile) -> int:
    return sum(nnb.buffers) * (4 if nnb.version == 2 else 1)


def _param_bytes(nnb: NnbFile) -> int:
    return sum(len(v.data) for v in nnb.variables if v.data is not None)


class NnbBackend:
    """Registered as target "nnb" (extension .nnb)."""

    name = "nnb"
    extensions = (".nnb",)
    output_is_directory = False
    requires: tuple[str, ...] = ()

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: the IR ops `lower.LOWERINGS` maps to runtime functions."""
        from .lower import LOWERINGS

        return {"nnb": dict.fromkeys(LOWERINGS, "yes")}

    def write(self, model: Model, out: str | os.PathLike[str], nnb_version: int = 3, api: int = 44,
              plan: str = "qcc", settings: str | None = None, **_: Any) -> list[str]:
        """Write the file; returns the functions computed in float because their operands'
        types differ (the driver reports them as float fallbacks)."""
        result = build_nnb(model, nnb_version=nnb_version, api=api, plan=plan, settings=settings)
        atomic_write_bytes(out, result.data)
        model.products["nnb"] = result.summary()
        return [n for n in result.notes if "computed in float" in n]


BACKEND = NnbBackend()
