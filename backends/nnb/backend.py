"""The "nnb" target: a .nnb file for nnabla-c-runtime (`qcc compile ... -o model.nnb`).

`--plan qcc` (default): the IR lowered to the runtime's functions, its fixed-point rules enforced
(legalize.py), activations in qcc's shared-object plan (plan.py). `--plan nnabla`: the file
nnabla's own converter writes for the same .nnp and settings (compat.py). Either way the bytes
are checked by the format layer before anything is written, and written atomically.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import attrs

from qcc.errors import UsageError
from qcc.io import atomic_write_bytes
from qcc.ir.core import Model
from qcc.ir.types import FixedPoint
from qcc.pm.base import Pass
from qcc.runtimes.base import EXACT, FLOAT, Runtime
from qcc.target import NNABLA_C_RUNTIME, Backend, Constraints, WriteResult, is_quantized

from .assemble import assemble
from .format import NnbFile, write_nnb
from .functions import FunctionTable, default_table
from .legalize import LegalizeNnb, check_legal
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
    """Lower, check and encode `model`, which must satisfy the runtime's rules already (the
    `legalize-nnb` pass, which the driver and `qcc.write` run, makes it so)."""
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
    program = check_legal(model, batch)
    notes = [*program.notes, *widened_weights_note(model)]
    buffers = plan_buffers(program, nnb_version, external_assignment(model))
    reference: BufferPlan = nnabla_plan(program, nnb_version)
    nnb = assemble(program, buffers, nnb_version, level, table)
    data = write_nnb(nnb, table)
    unit = 4 if nnb_version == 2 else 1
    return NnbResult(nnb, data, program, plan, buffers.method, buffers.total_bytes, reference.total_bytes,
                     buffers.lower_bound * unit, _param_bytes(nnb), tuple(notes))


def widened_weights_note(model: Model) -> list[str]:
    """The report line for fixed4's 4-bit weights, which .nnb stores as FIXED8 (exact)."""
    narrow = [v for v in model.graph.values() if v.is_const and isinstance(v.quant, FixedPoint) and v.quant.bits == 4]
    if not narrow:
        return []
    count = sum(int(v.const.size) for v in narrow if v.const is not None)
    return [f"{count} weights of {len(narrow)} tensors are 4-bit fixed point (fixed4), stored as FIXED8 at the "
            "same position: .nnb has no 4-bit type; exact, the values fit"]


def _buffer_bytes(nnb: NnbFile) -> int:
    return sum(nnb.buffers) * (4 if nnb.version == 2 else 1)


def _param_bytes(nnb: NnbFile) -> int:
    return sum(len(v.data) for v in nnb.variables if v.data is not None)


@attrs.frozen
class NnbOptions:
    version: Literal[2, 3] = attrs.field(default=3, metadata={"help": ".nnb format version"})
    api: int = attrs.field(default=44, metadata={"help": "nnabla-c-runtime API level the file may use"})
    plan: Literal["qcc", "nnabla"] = attrs.field(
        default="qcc", metadata={"help": "qcc's lowering and buffer plan, or nnabla_cli convert's bytes"})
    settings: str | None = attrs.field(
        default=None, metadata={"help": "settings.yaml nnabla_cli convert reads (plan=nnabla; --settings fills it; "
                                        "with plan=qcc the driver applies --settings at load)"})
    batch: int = attrs.field(default=1, metadata={"help": "batch size the file is written for"})

    def __attrs_post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be at least 1, got {self.batch}")
        default_table().check_level(self.api)


class NnbBackend(Backend):
    """A .nnb file for nnabla-c-runtime (lowered to the runtime's functions, its rules enforced)."""

    name = "nnb"
    extensions = (".nnb",)
    Options = NnbOptions

    def constraints(self, options: NnbOptions) -> Constraints:
        return Constraints(self.name, fixed_point=NNABLA_C_RUNTIME)

    def legalization(self, options: NnbOptions) -> list[Pass]:
        return [] if options.plan == "nnabla" else [LegalizeNnb(batch=options.batch)]

    def memory_plan(self, options: NnbOptions) -> str | None:
        return "plan-memory{kind=shared}"

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: the IR ops `lower.LOWERINGS` maps to runtime functions."""
        from .lower import LOWERINGS

        return {"nnb": dict.fromkeys(LOWERINGS, "yes")}

    def runtime(self, out: str | os.PathLike[str], options: NnbOptions, model: Model | None = None) -> Runtime:
        """nnabla-c-runtime's nnablart when found, else qcc's emulation of the decoded file."""
        from .runtime import nnb_runtime

        return nnb_runtime(out, EXACT if is_quantized(model) else FLOAT)

    def serialize(self, model: Model, out: str | os.PathLike[str], options: NnbOptions) -> WriteResult:
        """Write the file; the functions computed in float because their operands' types differ
        are float fallbacks of the report."""
        result = build_nnb(model, nnb_version=options.version, api=options.api, plan=options.plan,
                           settings=options.settings, batch=options.batch)
        atomic_write_bytes(out, result.data)
        return WriteResult(tuple(n for n in result.notes if "computed in float" in n), result.summary())


BACKEND = NnbBackend()
