"""The op registry: one schema per op holds everything qcc knows about it.

A schema gives the op's inputs/outputs, attribute types and defaults, shape inference, the numpy
reference kernel, an optional integer kernel for bit-exact fixed-point simulation, a verify hook
and traits that analyses use (views, elementwise in-place candidates). Adding an op means writing
one `OpDef` subclass in `qcc/ir/ops/` plus the frontend/backend mappings, nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from qcc.errors import InvalidInputError, UnsupportedError
from qcc.ir.types import TensorType

REQUIRED = object()
ATTR_KINDS = ("int", "float", "str", "bool", "ints", "floats", "strs", "float?")


@attrs.frozen
class AttrSpec:
    kind: str
    default: Any = REQUIRED
    doc: str = ""

    def check(self, value: Any) -> bool:
        scalar = {
            "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
            "bool": lambda v: isinstance(v, bool),
        }
        if self.kind == "float?":
            return value is None or scalar["float"](value)
        if self.kind in scalar:
            return bool(scalar[self.kind](value))
        element = {"ints": "int", "floats": "float", "strs": "str"}[self.kind]
        return isinstance(value, (list, tuple)) and all(scalar[element](v) for v in value)

    def normalize(self, value: Any) -> Any:
        if self.kind == "int":
            return int(value)
        if self.kind == "float":
            return float(value)
        if self.kind == "float?":
            return None if value is None else float(value)
        if self.kind == "ints":
            return [int(v) for v in value]
        if self.kind == "floats":
            return [float(v) for v in value]
        if self.kind == "strs":
            return [str(v) for v in value]
        return value


InferFn = Callable[[list[TensorType], dict[str, Any], list[np.ndarray | None]], list[TensorType]]
KernelFn = Callable[[Any, list[np.ndarray]], list[np.ndarray]]
VerifyFn = Callable[[Any], list[str]]


@attrs.frozen
class OpSchema:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, AttrSpec]
    infer: InferFn
    kernel: KernelFn
    verify: VerifyFn | None = None
    traits: frozenset[str] = frozenset()
    doc: str = ""

    # -------------------------------------------------------------- arity
    @functools.cached_property
    def min_inputs(self) -> int:
        return sum(1 for n in self.inputs if not n.endswith(("?", "*")))

    @functools.cached_property
    def max_inputs(self) -> int | None:
        return None if any(n.endswith("*") for n in self.inputs) else len(self.inputs)

    @property
    def variadic_outputs(self) -> bool:
        return any(n.endswith("*") for n in self.outputs)

    def has(self, trait: str) -> bool:
        return trait in self.traits

    # -------------------------------------------------------------- attrs
    def complete_attrs(self, given: dict[str, Any], where: str) -> dict[str, Any]:
        """Check attribute names/types, fill defaults; raises naming the node."""
        problems = self.check_attrs(given)
        if problems:
            raise InvalidInputError(f"node {where!r} ({self.name}): " + "; ".join(problems))
        out: dict[str, Any] = {}
        for key, spec in self.attrs.items():
            if key in given:
                out[key] = spec.normalize(given[key])
            elif spec.default is not REQUIRED:
                out[key] = list(spec.default) if isinstance(spec.default, (list, tuple)) else spec.default
        return out

    def check_attrs(self, given: dict[str, Any]) -> list[str]:
        problems = []
        for key, value in given.items():
            spec = self.attrs.get(key)
            if spec is None:
                problems.append(f"unknown attribute {key!r} (known: {sorted(self.attrs)})")
            elif not spec.check(value):
                problems.append(f"attribute {key!r} must be {spec.kind}, got {value!r}")
        for key, spec in self.attrs.items():
            if spec.default is REQUIRED and key not in given:
                problems.append(f"missing required attribute {key!r}")
        return problems

    # -------------------------------------------------------------- types
    def check_arity(self, n_inputs: int) -> str | None:
        if n_inputs < self.min_inputs or (self.max_inputs is not None and n_inputs > self.max_inputs):
            hi = "any" if self.max_inputs is None else self.max_inputs
            return f"{self.name} takes {self.min_inputs}..{hi} inputs, got {n_inputs}"
        return None

    def infer_types(
        self,
        inputs: Sequence[Any],
        attributes: dict[str, Any],
        where: str,
        num_outputs: int | None = None,
    ) -> list[TensorType]:
        problem = self.check_arity(len(inputs))
        if problem:
            raise InvalidInputError(f"node {where!r}: {problem}")
        for i, value in enumerate(inputs):
            if value is None and i < self.min_inputs:
                raise InvalidInputError(f"node {where!r} ({self.name}): required input {i} is missing")
        types = [v.type if v is not None else None for v in inputs]
        consts = [v.const if v is not None else None for v in inputs]
        try:
            result = self.infer(types, attributes, consts)  # type: ignore[arg-type]
        except (ValueError, IndexError, TypeError, ZeroDivisionError) as exc:
            raise InvalidInputError(f"node {where!r} ({self.name}): {exc}") from None
        if num_outputs is not None and len(result) != num_outputs:
            raise InvalidInputError(
                f"node {where!r} ({self.name}): expected {len(result)} outputs, got {num_outputs}"
            )
        return result


class OpDef:
    """Subclass, fill in the class attributes and static methods, decorate with @register."""

    name: ClassVar[str] = ""
    inputs: ClassVar[tuple[str, ...]] = ("x",)
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    attrs: ClassVar[dict[str, AttrSpec]] = {}
    traits: ClassVar[frozenset[str]] = frozenset()

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return [types[0]]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    verify: ClassVar[VerifyFn | None] = None


_REGISTRY: dict[str, OpSchema] = {}
_LOADED = False


def register(cls: type[OpDef]) -> type[OpDef]:
    name = cls.name or cls.__name__
    if name in _REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    verify = cls.__dict__.get("verify")
    _REGISTRY[name] = OpSchema(
        name=name,
        inputs=tuple(cls.inputs),
        outputs=tuple(cls.outputs),
        attrs=dict(cls.attrs),
        infer=cls.infer,
        kernel=cls.kernel,
        verify=verify.__func__ if isinstance(verify, staticmethod) else verify,
        traits=frozenset(cls.traits),
        doc=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
    )
    return cls


def _ensure_loaded() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import qcc.ir.ops  # noqa: F401  (registers the built-in ops)


def get_schema(op: str) -> OpSchema:
    _ensure_loaded()
    schema = _REGISTRY.get(op)
    if schema is None:
        raise UnsupportedError(f"unknown IR op {op!r}; known ops: {', '.join(sorted(_REGISTRY))}")
    return schema


def has_op(op: str) -> bool:
    _ensure_loaded()
    return op in _REGISTRY


def all_ops() -> dict[str, OpSchema]:
    _ensure_loaded()
    return dict(_REGISTRY)
