"""Passes, analyses and what they hand back to the pass manager."""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Union

import attrs

from qcc.errors import UsageError
from qcc.ir.core import Model

ALL = "*"


@attrs.frozen
class PassResult:
    """What a pass did: the (possibly same, mutated) model, whether it changed, what it kept valid."""

    model: Model
    modified: bool
    preserved: frozenset[str] = frozenset()

    @classmethod
    def unchanged(cls, model: Model) -> PassResult:
        return cls(model, False, frozenset({ALL}))


class Analysis:
    """A lazily computed, cached fact about a model (liveness, order, statistics)."""

    name: ClassVar[str] = ""

    def compute(self, model: Model, am: AnalysisManager) -> Any:
        raise NotImplementedError


class AnalysisManager:
    """Caches analyses per model; passes invalidate what they do not preserve."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, str], Any] = {}
        self.computed: list[str] = []

    def get(self, analysis: type[Analysis] | Analysis, model: Model) -> Any:
        instance = analysis() if isinstance(analysis, type) else analysis
        key = (id(model), instance.name or type(instance).__name__)
        if key not in self._cache:
            self.computed.append(key[1])
            self._cache[key] = instance.compute(model, self)
        return self._cache[key]

    def cached(self, name: str, model: Model) -> bool:
        return (id(model), name) in self._cache

    def invalidate(self, model: Model, preserved: frozenset[str]) -> None:
        if ALL in preserved:
            return
        for key in [k for k in self._cache if k[0] == id(model) and k[1] not in preserved]:
            del self._cache[key]


@attrs.define
class PassContext:
    """What a pass may use besides the model: analyses, data, options and the report."""

    analyses: AnalysisManager = attrs.field(factory=AnalysisManager)
    calib_data: dict[str, Any] | None = None
    options: dict[str, Any] = attrs.field(factory=dict)
    report: dict[str, Any] = attrs.field(factory=dict)
    progress: bool = False

    def note(self, key: str, entry: Any) -> None:
        """Append a line to a report section (e.g. 'float_fallbacks')."""
        self.report.setdefault(key, []).append(entry)


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


class Pass:
    """Base of every pass. Subclass as an `@attrs.frozen` class: its fields are its options.

    `name` is the CLI id; `requires` lists passes that must run earlier in the pipeline (or have
    run on the model already); the first docstring line is shown by `qcc passes`.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    @classmethod
    def doc(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def options(cls) -> list[OptionInfo]:
        """The attrs fields as options (`metadata={"help": ...}` is shown by `qcc passes`)."""
        pass_name = cls.name
        if not attrs.has(cls):
            return []
        hints = _field_types(cls)
        out = []
        for field in attrs.fields(cls):
            hint = hints[field.name]
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()  # type: ignore[attr-defined]
            elif default is attrs.NOTHING:
                default = REQUIRED
            out.append(OptionInfo(field.name, type_text(hint), default, make_parser(hint, f"{pass_name}.{field.name}"),
                                  str(field.metadata.get("help", ""))))
        return out

    @classmethod
    def from_options(cls, raw: dict[str, str]) -> Pass:
        infos = {o.name: o for o in cls.options()}
        kwargs = {}
        for key, text in raw.items():
            info = infos.get(key)
            if info is None:
                known = ", ".join(infos) or "none"
                raise UsageError(f"pass {cls.name!r} has no option {key!r} (options: {known})")
            kwargs[key] = info.parse(text)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"pass {cls.name!r}: {exc}") from None


def _field_types(cls: Any) -> dict[str, Any]:
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
                    f"pass {cls.name!r}: cannot resolve the type {hint!r} of option {field.name!r} ({exc})"
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
