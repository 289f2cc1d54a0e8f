"""nnabla-c-runtime's fixed-point rules: the `legalize-nnb` pass, and the check before writing.

The runtime computes garbage, crashes, or corrupts its own model when these do not hold
(docs/nnb-runtime-semantics.md). Lowering already makes every file correct where an exact
rewrite exists (lower.py: one type per Convolution/Affine kernel, the bias stored at the output's
position, a pinned Add2/Sub2 input converted to the other's position); here a qcc-chosen Add2/Sub2
position is moved instead, and the rules without an exact rewrite are enforced:
- bias position == output position in the fixed Affine/Convolution kernels (greater: the kernel
  divides the stored bias again on every forward; smaller: the forward fails);
- output position <= input + weight positions (Affine, Convolution, Mul2, MulScalar) and
  input 1 + output >= input 0 (Div2): the shifts are unsigned;
- Add2 / Sub2 inputs at one position (else the kernel rescales one input in its own buffer and
  changes that variable's position for good);
- AveragePooling should not raise the position (the upscale wraps; a pinned one is kept, qcc's
  simulator wraps the same way); rescales drop at most 6 positions and raise at most 8 in int8
  (a drop of 8 divides by zero, of 7 by -128) and drop at most 14 in int16.
Where the offending type was chosen by qcc the annotation is changed (and reported in the
`legalization` section of the report); where the user pinned it (settings.yaml / --override:
`meta['pinned']`) the pass fails naming the tensors. The pass is the nnb target's legalization:
the driver runs it last among the passes that change annotations, before --eval, so the model
evaluated is the model written. The backend then only checks (`check_legal`): a model that still
breaks a rule is an internal error naming the rule.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from qcc.errors import InternalError, UnsupportedError
from qcc.ir.core import Model, Value
from qcc.ir.types import FixedPoint, QuantType
from qcc.pm.base import Pass, PassContext, PassResult

from .format import DataType
from .lower import lower_model
from .program import BITS, MAX_FP_POS, NFunc, NVar, Program

Change = tuple[Value, QuantType, str]
RESCALED = frozenset({"ReLU", "MaxPooling", "Reshape", "Transpose", "Add2", "Sub2", "AddScalar"})
# rescale_fixed8/16: positions it may drop (a drop of 7 / 15 divides by -128 / -32768, of 8 by
# zero) and raise (int8 scales up through an int16 product)
RESCALE_RANGE = {8: (6, 8), 16: (14, 15)}
MAX_ROUNDS = 8


@attrs.frozen
class LegalizeNnb(Pass):
    """Make annotations satisfy nnabla-c-runtime's fixed-point rules (the nnb target's legalization)."""

    name = "legalize-nnb"

    batch: int = attrs.field(default=1, metadata={"help": "batch size the .nnb is written for"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        _, notes = legalize(model, self.batch)
        changed = [n for n in notes if " -> " in n]
        for note in changed:
            ctx.note("legalization", note)
        return PassResult(model, bool(changed), frozenset({"*"}))


def check_legal(model: Model, batch: int = 1) -> Program:
    """The lowered program of a model that already satisfies every rule (what the writer needs)."""
    program = lower_model(model, batch)
    changes, errors = check_rules(program)
    if errors:
        more = f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""
        raise UnsupportedError("target nnb: " + "; ".join(errors[:10]) + more)
    if changes:
        value, quant, why = changes[0]
        raise InternalError(f"target nnb: {value.name!r} is {value.quant}, but the rule '{why}' needs {quant}; "
                            "the legalize-nnb pass must run before the model is written")
    return program


def legalize(model: Model, batch: int = 1) -> tuple[Program, list[str]]:
    """The lowered program once every rule holds; notes list the annotations qcc changed."""
    notes: list[str] = []
    for _ in range(MAX_ROUNDS):
        program = lower_model(model, batch)
        changes, errors = check_rules(program)
        if errors:
            more = f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""
            raise UnsupportedError("target nnb: " + "; ".join(errors[:10]) + more)
        if not changes:
            program.notes[:0] = notes
            return program, program.notes
        done: set[int] = set()
        for value, quant, why in changes:
            if id(value) not in done:
                done.add(id(value))
                if isinstance(value.quant, FixedPoint) and isinstance(quant, FixedPoint):
                    quant = attrs.evolve(quant, rounding=value.quant.rounding)  # a new position, same store rule
                notes.append(f"{value.name}: {value.quant} -> {quant} ({why})")
                value.quant = quant
    raise InternalError(f"target nnb: fixed-point rules did not settle after {MAX_ROUNDS} rounds")


def check_rules(program: Program) -> tuple[list[Change], list[str]]:
    """Annotation changes that make the program legal, and the violations nothing can fix."""
    changes: list[Change] = []
    errors: list[str] = []
    for fn in program.functions:
        ins, out = fn.inputs, fn.outputs[0] if fn.outputs else None
        if out is None or not _all_fixed(fn):
            continue
        bits = BITS[out.storage.dtype]
        kind = fn.kind
        if kind in ("Affine", "Convolution", "DepthwiseConvolution"):
            _check_product(fn, ins[0], ins[1], out, changes, errors)
            if len(ins) > 2 and ins[2].storage.fp_pos != out.storage.fp_pos:
                _set(fn, ins[2], out.storage.fp_pos, "bias position must equal the output's", changes, errors)
        elif kind == "Mul2":
            _check_product(fn, ins[0], ins[1], out, changes, errors)
        elif kind == "Div2":
            low = ins[0].storage.fp_pos - ins[1].storage.fp_pos
            if out.storage.fp_pos < low:
                _set(fn, out, low, "Div2 needs input1 + output positions >= input0's", changes, errors)
        elif kind == "MulScalar":
            high = ins[0].storage.fp_pos + _mul_scalar_bits(float(fn.args["val"]), bits)  # type: ignore[arg-type]
            if out.storage.fp_pos > high:
                _set(fn, out, high, "MulScalar's output position exceeds input + scalar positions", changes, errors)
        elif kind in ("Add2", "Sub2") and ins[0].storage.fp_pos != ins[1].storage.fp_pos:
            finer = max(ins, key=lambda v: v.storage.fp_pos)
            coarser = min(v.storage.fp_pos for v in ins)
            _set(fn, finer, coarser, f"{kind} inputs must share a position", changes, errors)
        elif kind == "AveragePooling" and out.storage.fp_pos > ins[0].storage.fp_pos and not out.pinned:
            # the upscale wraps; qcc's simulator reproduces that, so a pinned position stays
            _set(fn, out, ins[0].storage.fp_pos, "AveragePooling cannot raise the position (it wraps)",
                 changes, errors)
        if kind in RESCALED:
            down, up = RESCALE_RANGE[bits]
            source = min(v.storage.fp_pos for v in ins) if kind in ("Add2", "Sub2") else ins[0].storage.fp_pos
            target = min(max(out.storage.fp_pos, source - down), source + up)
            if target != out.storage.fp_pos:
                _set(fn, out, target, f"int{bits} rescales must stay within {down} positions down and {up} up",
                     changes, errors)
    return changes, errors


def _all_fixed(fn: NFunc) -> bool:
    """True when the runtime picks the function's dedicated kernel of one fixed-point type."""
    dtypes = {v.storage.dtype for v in (*fn.inputs, *fn.outputs)}
    return len(dtypes) == 1 and next(iter(dtypes)) in (DataType.INT16, DataType.INT8)


def _check_product(fn: NFunc, x: NVar, w: NVar, y: NVar, changes: list[Change], errors: list[str]) -> None:
    """y's position must not exceed x's + w's: raise w's if the values still fit, else lower y's."""
    fx, fw, fy = x.storage.fp_pos, w.storage.fp_pos, y.storage.fp_pos
    if fy <= fx + fw:
        return
    want = fy - fx
    bits = BITS[w.storage.dtype]
    if w.is_param and not w.pinned and w.source is not None and want <= MAX_FP_POS and _fits(w, bits, want):
        changes.append((w.source, FixedPoint(bits, want), f"{fn.kind} {fn.name!r} needs output position "
                                                            f"<= input + weight positions"))
        return
    _set(fn, y, fx + fw, f"{fn.kind} needs output position <= input + weight positions ({fx} + {fw})",
         changes, errors)


def _fits(w: NVar, bits: int, frac: int) -> bool:
    if w.array is None:
        return False
    peak = float(np.max(np.abs(np.ldexp(w.array.astype(np.float64), frac)))) if w.array.size else 0.0
    return peak <= 2 ** (bits - 1) - 1


def _mul_scalar_bits(val: float, bits: int) -> int:
    """The position the runtime gives MulScalar's scalar (calc_scalar_fixed*_largebuff)."""
    v = np.float32(val)
    inner = float(np.float32(1.0 + abs(float(v))))
    s = np.float32(max(0.0, float(bits) - (1.0 + float(np.log2(np.float32(inner))))))
    return math.floor(float(s) + 0.5) if s >= 0 else 0


def _set(fn: NFunc, var: NVar, frac: int, why: str, changes: list[Change], errors: list[str]) -> None:
    """Move `var` to position `frac`, or report why that is not allowed."""
    where = f"function {fn.name!r} ({fn.kind}): {why}"
    if var.source is None:
        errors.append(f"{where}; {var.name!r} was added by qcc ({var.storage}), this is a bug")
    elif var.pinned:
        errors.append(f"{where}, but {var.name!r} is pinned to {var.storage} (settings.yaml/--override); "
                      f"it would need position {frac}")
    elif not 0 <= frac <= MAX_FP_POS:
        errors.append(f"{where}; {var.name!r} would need position {frac}, outside 0..{MAX_FP_POS}")
    else:
        changes.append((var.source, FixedPoint(BITS[var.storage.dtype], frac), f"{why}; {fn.name!r}"))
