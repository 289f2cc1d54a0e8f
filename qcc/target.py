"""The target contract: what a backend declares, and what it asks of the pipeline.

A backend is a `Backend`: a name, the extensions it claims, whether it writes a file or a
directory, typed options (an attrs class, parsed by the same code as pass options and listed by
`qcc targets`), the *constraints* it imposes, the *legalization* passes that make a model satisfy
them, and `write`, which only serializes.

Constraints reach the passes through `PassContext.target`: a pass asks "what positions may a
fixed-point value take here, and how does the runtime round what it stores?", never "is the
target nnb?". Legalization passes run at the end of the pipeline, before `--eval` and before
writing, so the evaluated model is the written one; a backend that still finds a broken rule
when it serializes raises an internal error naming the rule instead of changing the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from qcc.errors import UsageError
from qcc.ir.core import Model
from qcc.options import OptionInfo, build_options, option_infos

if TYPE_CHECKING:
    from qcc.runtimes.base import Runtime


@attrs.frozen
class FixedPointRules:
    """What a fixed-point runtime requires of widths and positions (value = int * 2**-frac)."""

    frac_range: tuple[int, int] | None = None
    """Positions the runtime can hold (None: any)."""
    rounding: Literal["half_even", "trunc"] = "half_even"
    """How the runtime stores what it computes (parameters are always rounded half to even)."""
    one_type_ops: frozenset[str] = frozenset()
    """Ops whose kernel casts every operand (x, weight, bias, y) to one type: one width class."""
    shared_input_ops: frozenset[str] = frozenset()
    """Binary ops whose two inputs must share a position (the kernel rescales one in place)."""
    product_limit: bool = False
    """Ops with the `product` trait need output position <= input + weight positions."""
    truncating_accumulation: frozenset[str] = frozenset()
    """Ops whose integer kernel truncates once per input channel while it accumulates, saturating
    the running sum in the output's type, and adds the bias last."""


NNABLA_C_RUNTIME = FixedPointRules(
    frac_range=(0, 15), rounding="trunc", one_type_ops=frozenset({"Conv", "ConvTranspose"}),
    shared_input_ops=frozenset({"Add", "Sub"}), product_limit=True, truncating_accumulation=frozenset({"Conv"}))
"""nnabla-c-runtime's fixed-point arithmetic (docs/nnb-runtime-semantics.md): the .nnb target, and
the C target's fixed-point mode, which computes exactly what the runtime computes."""

ANY_FIXED_POINT = FixedPointRules()
"""A runtime that takes any position and rounds half to even (ONNX QDQ scales 2**-frac)."""


@attrs.frozen
class Constraints:
    """What a target imposes on the model; `target` only names it in messages."""

    target: str = ""
    fixed_point: FixedPointRules = ANY_FIXED_POINT
    integer_affine: bool = False
    """Affine annotations run on integer kernels (qcc.sim.affine_int): --eval simulates those."""
    schemes: frozenset[str] | None = None
    """The --quantize schemes the target can write (None: all)."""

    def check_scheme(self, scheme: str) -> None:
        if self.schemes is not None and scheme not in self.schemes:
            raise UsageError(f"target {self.target!r} cannot write --quantize {scheme}: it takes "
                             f"{', '.join(sorted(self.schemes))}")


GENERIC = Constraints()
"""No target: what a PassContext holds unless a driver says otherwise."""


@attrs.frozen
class NoOptions:
    """A target without options."""


@attrs.frozen
class WriteResult:
    """What a backend reports about the file it wrote (sections of the compile report)."""

    float_fallbacks: tuple[Any, ...] = ()
    summary: Mapping[str, Any] = attrs.field(factory=dict)


class Backend:
    """Base of every target. Subclass, set the class attributes, implement `write`."""

    name: ClassVar[str] = ""
    extensions: ClassVar[tuple[str, ...]] = ()
    """Extensions that choose this target when --target is not given."""
    file_extensions: ClassVar[tuple[str, ...] | None] = None
    """Extensions of the files it writes when chosen by name (None: `extensions`); `-o` with another
    target's extension is a usage error."""
    writes_directory: ClassVar[bool] = False
    requires: ClassVar[tuple[str, ...]] = ()
    """Passes that must have run (a backend that needs e.g. a memory plan names its pass)."""
    Options: ClassVar[type] = NoOptions
    """An attrs class: its fields are the target's options."""

    @property
    def output_is_directory(self) -> bool:
        return self.writes_directory

    @classmethod
    def doc(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def option_infos(cls) -> list[OptionInfo]:
        return option_infos(cls.Options, f"target {cls.name!r}", cls.name)

    def parse_options(self, raw: Mapping[str, str]) -> Any:
        """Options from spec strings (`--target nnb{version=2}`)."""
        return build_options(self.Options, raw, f"target {self.name!r}", self.name)

    def make_options(self, **values: Any) -> Any:
        """Options from Python values (the API), checked like the strings are."""
        known = {f.name for f in attrs.fields(self.Options)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UsageError(f"target {self.name!r} has no option {unknown[0]!r} "
                             f"(options: {', '.join(sorted(known)) or 'none'})")
        try:
            return self.Options(**values)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"target {self.name!r}: {exc}") from None

    def constraints(self, options: Any) -> Constraints:
        return Constraints(self.name)

    def legalization(self, options: Any) -> Sequence[Any]:
        """Passes (instances) that make a model satisfy this target; run last, before --eval."""
        return ()

    def memory_plan(self, options: Any) -> str | None:
        """The pipeline spec of the memory plan this target's runtime uses (None: none)."""
        return None

    def runtime(self, out: str | os.PathLike[str], options: Any, model: Model | None = None) -> Runtime | None:
        """How a file this target wrote is run (qcc.runtimes), for --eval and `qcc run`/`qcc eval`;
        `model` (the compiled IR, when known) sets the declared tolerance. None: no runtime here."""
        return None

    def write(self, model: Model, out: str | os.PathLike[str], options: Any = None) -> WriteResult:
        """Serialize `model` (default options unless given); see `serialize`."""
        return self.serialize(model, out, self.make_options() if options is None else options)

    def serialize(self, model: Model, out: str | os.PathLike[str], options: Any) -> WriteResult:
        """Write the model as it is, atomically; change nothing (legalization already ran)."""
        raise NotImplementedError


class LegacyBackend(Backend):
    """A plugin backend written before the typed contract: `name`, `extensions`, `write(model, out)`.

    It takes no options and imposes no constraints; everything else is read off the object.
    """

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    @property
    def name(self) -> str:  # type: ignore[override]
        return str(self.wrapped.name)

    @property
    def extensions(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(getattr(self.wrapped, "extensions", ()))

    @property
    def writes_directory(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.wrapped, "output_is_directory", False))

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(getattr(self.wrapped, "requires", ()))

    def parse_options(self, raw: Mapping[str, str]) -> Any:
        if raw:
            raise UsageError(f"target {self.name!r} takes no options (got {', '.join(sorted(raw))})")
        return NoOptions()

    def make_options(self, **values: Any) -> Any:
        return self.parse_options({k: str(v) for k, v in values.items()})

    def serialize(self, model: Model, out: str | os.PathLike[str], options: Any) -> WriteResult:
        returned = self.wrapped.write(model, out)
        return WriteResult(tuple(returned or ()))


def is_quantized(model: Model | None) -> bool:
    """Any value annotated with a non-float type (what decides a runtime's declared tolerance)."""
    from qcc.ir.types import Float32

    return model is not None and any(v.quant is not None and not isinstance(v.quant, Float32)
                                     for v in model.graph.values())


def as_backend(obj: Any) -> Backend:
    """Every registered backend as a `Backend` (plugins may register plain objects)."""
    if isinstance(obj, Backend):
        return obj
    if isinstance(obj, type) and issubclass(obj, Backend):
        return obj()
    return LegacyBackend(obj)
