"""Typed options from attrs fields: one parser for pass options and target options.

A pass or a target declares its options as the fields of an attrs class; `qcc passes` and
`qcc targets` list them with types and defaults, and spec strings (`calibrate{method=entropy}`,
`nnb{version=2}`) are parsed into them here, with one-line errors naming the owner and option.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

import attrs

from qcc.errors import UsageError


class _Required:
    def __repr__(self) -> str:
        return "(required)"


REQUIRED: Any = _Required()
"""The default shown for an option without one."""


@attrs.frozen
class OptionInfo:
    name: str
    type_text: str
    default: Any
    parse: Callable[[str], Any]
    help: str = ""


def option_infos(cls: Any, owner: str, prefix: str) -> list[OptionInfo]:
    """The attrs fields of `cls` as options; `owner` names it in errors (e.g. "pass 'calibrate'")."""
    if not attrs.has(cls):
        return []
    hints = _field_types(cls, owner)
    out = []
    for field in attrs.fields(cls):
        hint = hints[field.name]
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()  # type: ignore[attr-defined]
        elif default is attrs.NOTHING:
            default = REQUIRED
        out.append(OptionInfo(field.name, type_text(hint), default, make_parser(hint, f"{prefix}.{field.name}"),
                              str(field.metadata.get("help", ""))))
    return out


def build_options(cls: Any, raw: Mapping[str, str], owner: str, prefix: str) -> Any:
    """An instance of `cls` from option strings, each parsed by its field's type."""
    infos = {o.name: o for o in option_infos(cls, owner, prefix)}
    kwargs = {}
    for key, text in raw.items():
        info = infos.get(key)
        if info is None:
            known = ", ".join(infos) or "none"
            raise UsageError(f"{owner} has no option {key!r} (options: {known})")
        kwargs[key] = info.parse(text)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{owner}: {exc}") from None


def _field_types(cls: Any, owner: str) -> dict[str, Any]:
    """Resolved field annotations; names `typing` exports resolve even if the module lacks them."""
    try:
        return typing.get_type_hints(cls)
    except Exception:
        pass
    module = sys.modules.get(cls.__module__)
    scope = {**{n: getattr(typing, n) for n in typing.__all__}, **(vars(module) if module else {})}
    out = {}
    for field in attrs.fields(cls):
        hint = field.type
        if isinstance(hint, str):
            try:
                hint = eval(hint, scope)
            except Exception as exc:
                raise UsageError(
                    f"{owner}: cannot resolve the type {hint!r} of option {field.name!r} ({exc})"
                ) from None
        out[field.name] = hint if hint is not None else str
    return out


def type_text(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "|".join(str(a) for a in typing.get_args(hint))
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(hint))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return f"list[{type_text(args[0]) if args else 'str'}]"
    if hint is type(None):
        return "none"
    return getattr(hint, "__name__", str(hint))


def make_parser(hint: Any, where: str) -> Callable[[str], Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)

    def fail(text: str, want: str) -> UsageError:
        return UsageError(f"option {where}: {text!r} is not {want}")

    if origin is Literal:
        def parse_literal(text: str) -> Any:
            for choice in args:
                if str(choice) == text:
                    return choice
            raise fail(text, "one of " + "|".join(str(a) for a in args))
        return parse_literal
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = make_parser(members[0], where)
        return lambda text: None if text in ("none", "None", "") else inner(text)
    if origin in (tuple, list):
        element = [a for a in args if a is not Ellipsis]
        inner = make_parser(element[0] if element else str, where)
        return lambda text: tuple(inner(t) for t in text.split("|") if t != "")
    if hint is bool:
        def parse_bool(text: str) -> bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise fail(text, "a boolean")
        return parse_bool
    if hint in (int, float):
        def parse_number(text: str) -> Any:
            try:
                return hint(text)
            except ValueError:
                raise fail(text, f"a {hint.__name__}") from None
        return parse_number
    return str


def choice_error(flag: str, value: str, choices: Sequence[str]) -> UsageError:
    """`--flag VALUE` outside `choices`: one line with the closest choice (difflib), case ignored."""
    import difflib

    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(value).lower(), list(lowered), n=1, cutoff=0.5)
    hint = f"; did you mean {lowered[close[0]]!r}?" if close else ""
    return UsageError(f"{flag} {value!r} is not one of {', '.join(choices)}{hint}")
