"""The `apply-overrides` pass: the user's per-tensor types (--override PATTERN=TYPE) as pins.

A rule is `PATTERN=TYPE`, PATTERN a glob on value names (fnmatch, case-sensitive), TYPE one of

| TYPE | effect |
|---|---|
| FLOAT32 | pinned float (`Float32`), listed in the report's float_fallbacks |
| FIXED8_<pos>, FIXED16_<pos> | pinned `FixedPoint(bits, pos)` |
| FIXED8, FIXED16 | width only: `assign-fixed-point` still chooses the position |
| INT8, UINT8, INT16 | affine dtype only: `quantize-affine` still chooses scale/zero point |
| SIGN | pinned `Sign` (constants holding only +1/-1) |

Rules apply in order, so a later rule wins for a tensor two rules match. A pattern that matches
nothing is an error (a typo would otherwise be silently ignored). nnabla's settings.yaml
(`--settings`, exact names) is applied by the driver when the model is loaded
(qcc.formats.settings_yaml); both pin with `meta["pinned"]`. Runs before the annotation passes, which
honour the pins and report a conflict with a target rule instead of adjusting a pinned value.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

import attrs
import numpy as np
from qcc.passes.quantutil import is_float

from qcc.errors import UsageError
from qcc.ir.core import Model, Value
from qcc.ir.types import FRAC_RANGE, FixedPoint, Float32, Sign
from qcc.pm.base import Pass, PassContext, PassResult

_TYPE = re.compile(r"^(FLOAT32|SIGN|INT8|UINT8|INT16|FIXED(8|16)(?:_(\d+))?)$")
OVERRIDE_KEYS = ("pinned", "override", "bits", "affine_dtype", "float_reason")


@attrs.frozen
class Override:
    """One parsed rule."""

    pattern: str
    type_text: str
    source: str

    def apply(self, value: Value) -> None:
        for key in OVERRIDE_KEYS:
            value.meta.pop(key, None)
        value.meta["override"] = f"{self.type_text} ({self.source} {self.pattern!r})"
        m = _TYPE.match(self.type_text)
        assert m is not None
        if self.type_text == "FLOAT32":
            value.quant = Float32()
            value.meta["pinned"] = True
            value.meta["float_reason"] = f"override FLOAT32 ({self.source} {self.pattern!r})"
        elif self.type_text == "SIGN":
            data = value.const
            if data is None or not np.isin(data, (-1.0, 1.0)).all():
                raise UsageError(f"{self.source} {self.pattern}=SIGN: {value.name!r} is not a constant of "
                                 "+1/-1 values; binarize with --quantize binary-weight/binary-connect")
            value.quant = Sign()
            value.meta["pinned"] = True
        elif self.type_text.startswith("FIXED"):
            bits = int(m.group(2))
            if m.group(3) is None:
                value.quant = None
                value.meta["bits"] = bits
            else:
                value.quant = FixedPoint(bits, int(m.group(3)))
                value.meta["pinned"] = True
        else:
            value.quant = None
            value.meta["affine_dtype"] = self.type_text.lower()


def parse_rule(text: str, source: str = "--override") -> Override:
    pattern, sep, type_text = text.rpartition("=")
    pattern, type_text = pattern.strip(), type_text.strip().upper()
    if not sep or not pattern:
        raise UsageError(f"{source} {text!r}: expected PATTERN=TYPE (e.g. 'conv1*=FIXED16')")
    match = _TYPE.match(type_text)
    if not match:
        raise UsageError(f"{source} {text!r}: unknown type {type_text[:40]!r}; use FLOAT32, FIXED8, FIXED16, "
                         "FIXED8_<pos>, FIXED16_<pos>, INT8, UINT8, INT16 or SIGN")
    if match.group(3) is not None and not 0 <= int(match.group(3)) <= FRAC_RANGE[1]:
        raise UsageError(f"{source} {text!r}: position {match.group(3)[:20]} is outside 0..{FRAC_RANGE[1]} "
                         "(the value is int * 2**-position)")
    return Override(pattern, type_text, source)


def _rules(value: tuple[str, ...]) -> tuple[str, ...]:
    for text in value:
        parse_rule(text, "apply-overrides rule")
    return tuple(value)


@attrs.frozen
class ApplyOverrides(Pass):
    """Pin user types (--override PATTERN=TYPE, or rules=...) before the annotation passes."""

    name = "apply-overrides"

    rules: tuple[str, ...] = attrs.field(default=(), converter=_rules,
                                         metadata={"help": "PATTERN=TYPE rules, '|'-separated"})
    from_cli: bool = attrs.field(default=True, metadata={"help": "also the --override rules"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        overrides = [parse_rule(r, "apply-overrides rule") for r in self.rules]
        if self.from_cli:
            overrides += [parse_rule(r) for r in ctx.overrides]
        if not overrides:
            return PassResult.unchanged(model)
        values = [v for v in model.graph.values() if is_float(v)]
        changed = apply_rules(values, overrides, ctx)
        return PassResult(model, changed > 0, frozenset({"*"}))


def apply_rules(values: Iterable[Value], rules: list[Override], ctx: PassContext) -> int:
    """Apply in order (a later rule wins); a pattern matching nothing is a usage error."""
    values = list(values)
    changed = 0
    for rule in rules:
        hits = [v for v in values if fnmatch.fnmatchcase(v.name, rule.pattern)]
        if not hits:
            sample = ", ".join(v.name for v in values[:12])
            raise UsageError(f"{rule.source} {rule.pattern}={rule.type_text}: the pattern matches no "
                             f"tensor (names look like: {sample})")
        for value in hits:
            rule.apply(value)
        changed += len(hits)
        ctx.note("overrides", {"pattern": rule.pattern, "type": rule.type_text, "source": rule.source,
                               "matched": len(hits)})
    return changed
