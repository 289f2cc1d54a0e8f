"""nnabla settings.yaml (`nnabla_cli nnb_template` / `nnabla_cli convert -s`) to and from qcc.

The file maps variable names to storage types (FLOAT32, FIXED16, FIXED16_<pos>, FIXED8,
FIXED8_<pos>, SIGN) and function names to an `implement` number. Export writes qcc's annotations
in that form, in the order and layout nnabla writes, so the same .nnp gives the same template.
Import pins the types: the annotation is stored on the value with `meta['pinned'] = True`, and
later passes leave pinned values alone. A FIXED type without a position is only allowed for
parameters; the position is nnabla's automatic one (`meta['settings.auto_position'] = True`
says a pass may recompute it if the weights change, e.g. after BN folding).
"""

from __future__ import annotations

import os
import re
import reprlib
from typing import Any

from qcc import limits
from qcc.errors import InvalidInputError, UnsupportedError, UsageError
from qcc.formats.nnp import INTERNAL
from qcc.ir.core import Model, Node, Value
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign

_TYPE = re.compile(r"^(FLOAT32|SIGN|FIXED(8|16)(?:_(\d{1,4}))?)$")
MAX_POSITION = 15
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict = 2, 60, 60, 4, 2


def _shown(value: Any) -> str:
    """A bounded repr of a value from the file: an alias bomb must not turn into a 10^9-item message."""
    return _SHOWN.repr(value)


def _key(name: Any) -> str:
    """A mapping key as the name it looks up (YAML may give ints, floats, bools, dates...)."""
    return name if isinstance(name, str) else _shown(name)


def _exported_values(model: Model) -> list[Value]:
    """Inputs, node outputs and constants nnabla would list, in the source file's variable order."""
    graph = model.graph
    order = {name: i for i, name in enumerate(model.metadata.get("nnp.variables", []))}
    listed: list[Value] = []
    seen: set[int] = set()

    def add(value: Value | None) -> None:
        if value is not None and id(value) not in seen and not value.meta.get(INTERNAL):
            seen.add(id(value))
            listed.append(value)

    for value in graph.inputs:
        add(value)
    for node in graph.nodes:
        for out in node.outputs:
            add(out)
    for node in graph.nodes:
        for used in node.inputs:
            if used is not None and used.is_const:
                add(used)
    keys: list[tuple[float, int]] = []
    last = -1.0
    for position, value in enumerate(listed):
        if value.name in order:
            last = float(order[value.name])
            keys.append((last, position))
        else:
            keys.append((last + 0.5, position))
    return [listed[position] for _, position in sorted(keys)]


def type_name(value: Value) -> str:
    """The settings.yaml type for a value's annotation (UnsupportedError when there is none)."""
    quant = value.quant
    if quant is None or isinstance(quant, Float32):
        return "FLOAT32"
    if isinstance(quant, Sign):
        return "SIGN"
    if isinstance(quant, Affine) and quant.axis is None and quant.zero_point == (0,) and quant.dtype in ("int8", "int16"):
        exponent = _log2_int(quant.scale[0])
        if exponent is not None:
            quant = FixedPoint(8 if quant.dtype == "int8" else 16, -exponent)
    if isinstance(quant, FixedPoint) and quant.bits in (8, 16) and 0 <= quant.frac <= MAX_POSITION:
        return f"FIXED{quant.bits}_{quant.frac}"
    raise UnsupportedError(f"tensor {value.name!r}: annotation {quant} has no settings.yaml type "
                           f"(FLOAT32, SIGN, FIXED8_0..15, FIXED16_0..15)")


def _log2_int(scale: float) -> int | None:
    import math

    if scale <= 0:
        return None
    exponent = math.log2(scale)
    return int(exponent) if exponent == int(exponent) else None


def _exported_nodes(model: Model) -> list[Node]:
    return [n for n in model.graph.nodes if not n.meta.get(INTERNAL)]


def export_settings(model: Model) -> str:
    """settings.yaml text for the model, laid out like `nnabla_cli nnb_template` writes it."""
    import yaml

    functions = {n.name: {"implement": int(n.meta.get("nnb.implement", 0))} for n in _exported_nodes(model)}
    variables = {v.name: type_name(v) for v in _exported_values(model)}
    return str(yaml.safe_dump({"functions": functions, "variables": variables}, default_flow_style=False,
                               sort_keys=False))


def parse_type(text: Any, value: Value, where: str) -> tuple[QuantType, bool]:
    """One settings.yaml type for `value` and whether its position was automatic.

    Raises InvalidInputError naming `where`.
    """
    match = _TYPE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInputError(f"{where}: unknown type {_shown(text)} (FLOAT32, SIGN, FIXED8, FIXED16, "
                                "FIXED8_<pos>, FIXED16_<pos>)")
    if match.group(1) == "FLOAT32":
        return Float32(), False
    if match.group(1) == "SIGN":
        if not value.is_const:
            raise InvalidInputError(f"{where}: SIGN is only for parameters; {value.name!r} is a buffer")
        return Sign(), False
    bits = int(match.group(2))
    if match.group(3) is not None:
        position = int(match.group(3))
        if position > MAX_POSITION:
            raise InvalidInputError(f"{where}: position {position} is outside 0..{MAX_POSITION}")
        return FixedPoint(bits, position), False
    if value.const is None:
        raise InvalidInputError(f"{where}: buffer {value.name!r} needs an explicit position "
                                f"(FIXED{bits}_<pos>); only parameters get an automatic one")
    from qcc.quant.fixedpoint import param_fixed_point_position

    position = param_fixed_point_position(value.const, bits, "nnabla", name=value.name)
    if not 0 <= position <= MAX_POSITION:
        raise InvalidInputError(f"{where}: nnabla's automatic position for {value.name!r} is {position}, "
                                f"outside 0..{MAX_POSITION}")
    return FixedPoint(bits, position), True


def _load(text: str, source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    import yaml

    # libyaml's parser when present: same safe constructor, linear on deep nesting (which the pure
    # Python parser takes seconds to refuse) and a nesting limit of its own
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(text, Loader=loader)  # a SafeLoader: builds no Python objects
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"{source}: not valid YAML: {str(exc)[:300]}") from None
    except RecursionError:
        raise InvalidInputError(f"{source}: YAML nested too deeply") from None
    except ValueError as exc:  # PyYAML's own conversions, e.g. a 5000-digit integer
        raise InvalidInputError(f"{source}: not valid YAML: {str(exc)[:300]}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{source}: a settings file is a mapping with 'functions' and 'variables'")
    extra = sorted(_shown(k) for k in doc if k not in ("functions", "variables"))
    if extra:
        raise InvalidInputError(f"{source}: unknown top-level key(s) {extra} (only 'functions', 'variables')")
    sections = []
    for key in ("functions", "variables"):
        section = doc.get(key) or {}
        if not isinstance(section, dict):
            raise InvalidInputError(f"{source}: '{key}' must be a mapping, not {type(section).__name__}")
        sections.append(section)
    return sections[0], sections[1]


def apply_settings(model: Model, text: str, source: str = "settings.yaml") -> list[str]:
    """Pin the file's types on the model's values; returns notes on entries that had no effect.

    Unknown variable/function names and unknown types are errors (all of them, in one
    InvalidInputError naming the file and the entries). Names the source .nnp declared but qcc
    no longer has (e.g. the float weight of a binary function) are notes, not errors.
    """
    functions, variables = _load(text, source)
    values = model.graph.value_map()
    nodes = model.graph.node_map()
    known = set(model.metadata.get("nnp.variables", [])) | set(model.metadata.get("nnp.functions", []))
    errors: list[str] = []
    notes: list[str] = []
    pins: list[tuple[Value, tuple[QuantType, bool]]] = []
    for name, entry in variables.items():
        key = _key(name)
        if key not in values:
            if key in known:
                notes.append(f"{source}: variable {key!r} is not in qcc's graph (folded or unused); ignored")
            else:
                errors.append(f"variables.{key[:100]}: no such variable")
            continue
        try:
            pins.append((values[key], parse_type(entry, values[key], f"variables.{key}")))
        except InvalidInputError as exc:
            errors.append(str(exc))
    implements: list[tuple[Node, int]] = []
    for name, entry in functions.items():
        key = _key(name)
        implement = entry.get("implement", 0) if isinstance(entry, dict) else None
        if key not in nodes:
            if key in known:
                notes.append(f"{source}: function {key!r} is not in qcc's graph; ignored")
            else:
                errors.append(f"functions.{key[:100]}: no such function")
        elif not isinstance(implement, int) or isinstance(implement, bool) or not 0 <= implement <= 0xFFFF:
            errors.append(f"functions.{key}: expected {{implement: <0..65535>}}, got {_shown(entry)}")
        else:
            implements.append((nodes[key], implement))
    if errors:
        if len(errors) == 1:
            raise InvalidInputError(f"{source}: 1 bad entry: {errors[0]}")
        error = InvalidInputError(f"{source}: {len(errors)} bad entries, listed one per line above; the first: "
                                  f"{errors[0]}")
        error.details = [f"{source}: {e}" for e in errors]  # type: ignore[attr-defined]  # one line each (qcc.cli)
        raise error
    for value, (quant, automatic) in pins:
        value.quant = quant
        value.meta["pinned"] = True
        if automatic:
            value.meta["settings.auto_position"] = True
    for node, implement in implements:
        node.meta["nnb.implement"] = implement
    return notes


def read_settings_text(path: str | os.PathLike[str]) -> str:
    """The text of a settings file: size-checked before reading, UTF-8, errors naming the file."""
    source = os.fspath(path)
    try:
        size = os.path.getsize(source)
        limits.check_count("bytes", size, limits.current().max_file_bytes, source)
        with open(source, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise UsageError(f"{source}: no such file") from None
    except OSError as exc:
        raise InvalidInputError(f"{source}: cannot read settings: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{source}: not UTF-8 text (byte {exc.start}); a settings file is YAML") from None


def apply_settings_file(model: Model, path: str | os.PathLike[str]) -> list[str]:
    """`apply_settings` on a file (what `qcc compile --settings` does)."""
    return apply_settings(model, read_settings_text(path), os.fspath(path))
