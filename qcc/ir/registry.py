"""The op registry: one schema per op holds everything qcc knows about it.

A schema gives the op's inputs/outputs, attribute types and defaults, shape inference, the numpy
reference kernel, a verify hook, the *role* of each input (data, weight with its output-channel
axis, bias) and *traits* (see `TRAITS`). Passes, simulators, planners and backends ask the
registry (`get_schema(op).has(...)`, `ops_with(trait)`, `schema.weight_input`) instead of keeping
their own lists of op names, so an op added here is understood everywhere at once. Adding an op
means one `OpDef` subclass in `qcc/ir/ops/` plus one entry in each frontend/backend table that
maps it (docs/adding-an-op.md), nothing else.
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

TRAITS: dict[str, str] = {
    "view": "the output is the input's bytes under another shape (same values, same order): planners "
            "alias it, integer targets copy nothing, quantization carries the input's annotation",
    "elementwise": "each output element depends on the input elements at its own position only "
                   "(broadcasting binary ops included)",
    "inplace": "the output may be written over input 0 (same shape and element count): a planner "
               "may reuse that buffer when the input dies here",
    "keeps_annotation": "the output holds values of input 0 unchanged (no arithmetic: views, Relu, "
                        "max pooling, Concat, Transpose, Slice, Split): it carries that input's "
                        "quantization annotation, no requantization",
    "rearranges": "the output holds exactly the values of its data inputs, only rearranged: its "
                  "calibration statistics are the merge of theirs",
    "quantize": "an explicit quantize point: fake-quantizes its input to its output's annotation",
    "quantizes_constants": "a constant input is quantized per tensor like an activation (binary "
                           "arithmetic, Concat); other ops keep constant non-weight inputs in float",
    "product": "the output is a product of input 0 and input 1 (Conv, Dense, Mul): fixed-point "
               "targets compare the output position with the sum of theirs",
    "broadcast": "inputs broadcast against each other (numpy rules)",
    "clamp": "the output is the input clipped elementwise to the bounds `OpSchema.bounds(attrs)` gives "
             "(Relu: [0, inf), Clip: its attributes): with a lower bound of 0 it commutes with a positive "
             "per-channel scale wherever the upper bound is not reached (cross-layer equalization; bias "
             "correction averages only where the clamp passes values through)",
    "channel_pool": "each output channel (axis 1) pools its own input channel by max or mean: f(x * s) "
                    "== f(x) * s for a positive per-channel s, and a constant channel stays that constant "
                    "(a mean that counts padding excepted: count_include_pad); per-channel maps move "
                    "through it (equalize)",
    "scatters": "each input position is spread over several output positions through the kernel "
                "(ConvTranspose): a per-input-channel shift does not reach every output alike, so "
                "passes that fold input-side maps or reason per input patch leave it alone",
}
"""The trait vocabulary; `register` refuses a trait not listed here (a typo would silently
exclude an op from an analysis)."""


@attrs.frozen
class Role:
    """What an input is to its op: activation data, a weight, or a bias.

    `channel_axis` is a weight's output-channel axis (per-channel quantization scales, BN folding).
    """

    kind: str = "data"
    channel_axis: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("data", "weight", "bias"):
            raise ValueError(f"unknown input role {self.kind!r}")


DATA = Role()
BIAS = Role("bias")


def weight(channel_axis: int) -> Role:
    return Role("weight", channel_axis)


_SCALAR_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
}
"""What an attribute value of each scalar kind may be (built once: verify checks every attribute)."""


@attrs.frozen
class AttrSpec:
    kind: str
    default: Any = REQUIRED
    doc: str = ""

    def check(self, value: Any) -> bool:
        scalar = _SCALAR_CHECKS
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
BoundsFn = Callable[[dict[str, Any]], tuple[float | None, float | None]]


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
    roles: tuple[Role, ...] = ()
    """One per declared input (variadic inputs share the last one)."""
    bounds: BoundsFn | None = None
    """A `clamp` op's (lower, upper) from its attributes (None: unbounded on that side)."""

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
        if trait not in TRAITS:
            raise KeyError(f"unknown trait {trait!r}; known: {', '.join(TRAITS)}")
        return trait in self.traits

    def role(self, index: int) -> Role:
        """The role of input `index` (data unless the schema says otherwise)."""
        if not self.roles:
            return DATA
        return self.roles[min(index, len(self.roles) - 1)]

    @functools.cached_property
    def weight_input(self) -> int | None:
        """Index of the weight input, None for ops without one."""
        return next((i for i, r in enumerate(self.roles) if r.kind == "weight"), None)

    @functools.cached_property
    def bias_input(self) -> int | None:
        return next((i for i, r in enumerate(self.roles) if r.kind == "bias"), None)

    @property
    def weight_axis(self) -> int | None:
        """The weight's output-channel axis (None without a weight)."""
        index = self.weight_input
        return None if index is None else self.roles[index].channel_axis

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
    roles: ClassVar[dict[str, Role]] = {}
    """Input name (as in `inputs`, without ?/*) -> role; unnamed inputs are data."""

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return [types[0]]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    verify: ClassVar[VerifyFn | None] = None

    @staticmethod
    def bounds(attrs: dict[str, Any]) -> tuple[float | None, float | None]:
        """With the `clamp` trait: (lower, upper) from the node's attributes (None: unbounded)."""
        raise NotImplementedError


_REGISTRY: dict[str, OpSchema] = {}
_DERIVED: dict[str, frozenset[str]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    name = cls.name or cls.__name__
    if name in _REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    verify = cls.__dict__.get("verify")
    unknown = set(cls.traits) - set(TRAITS)
    if unknown:
        raise ValueError(f"op {name!r}: unknown trait(s) {sorted(unknown)}; known: {', '.join(TRAITS)}")
    names = [n.rstrip("?*") for n in cls.inputs]
    stray = set(cls.roles) - set(names)
    if stray:
        raise ValueError(f"op {name!r}: roles name inputs it does not have: {sorted(stray)}")
    roles = tuple(cls.roles.get(n, DATA) for n in names) if cls.roles else ()
    bounds = cls.bounds if cls.bounds is not OpDef.bounds else None
    if ("clamp" in cls.traits) != (bounds is not None):
        raise ValueError(f"op {name!r}: the clamp trait and a bounds function go together")
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
        roles=roles,
        bounds=bounds,
    )
    _DERIVED.clear()
    return cls


def get_schema(op: str) -> OpSchema:
    schema = _REGISTRY.get(op)
    if schema is None:
        raise UnsupportedError(f"unknown IR op {op!r}; known ops: {', '.join(sorted(_REGISTRY))}")
    return schema


def has_op(op: str) -> bool:
    return op in _REGISTRY


def all_ops() -> dict[str, OpSchema]:
    return dict(_REGISTRY)


def ops_with(trait: str) -> frozenset[str]:
    """Names of every registered op with `trait` (plugin ops included): the op-category sets."""
    if trait not in TRAITS:
        raise KeyError(f"unknown trait {trait!r}; known: {', '.join(TRAITS)}")
    if trait not in _DERIVED:
        _DERIVED[trait] = frozenset(n for n, s in _REGISTRY.items() if trait in s.traits)
    return _DERIVED[trait]


def op_has(op: str, trait: str) -> bool:
    """`trait` of a registered op; False for an op the registry does not know."""
    return op in ops_with(trait)


def weighted_ops() -> dict[str, int]:
    """Ops with a weight input -> the weight's output-channel axis."""
    return {n: s.weight_axis for n, s in _REGISTRY.items() if s.weight_axis is not None}
