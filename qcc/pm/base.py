"""Passes, analyses and what they hand back to the pass manager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from qcc.ir.core import Model
from qcc.options import REQUIRED, OptionInfo, build_options, make_parser, option_infos, type_text
from qcc.target import GENERIC, Constraints

__all__ = ["ALL", "REQUIRED", "Analysis", "AnalysisManager", "OptionInfo", "Pass", "PassContext", "PassResult",
           "make_parser", "type_text"]

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

    def store(self, analysis: type[Analysis], model: Model, value: Any) -> None:
        """Cache a result a pass computed itself (e.g. `calibrate`'s statistics, which need data)."""
        self._cache[(id(model), analysis.name or analysis.__name__)] = value

    def peek(self, analysis: type[Analysis], model: Model) -> Any:
        """The cached result, or None (never computes)."""
        return self._cache.get((id(model), analysis.name or analysis.__name__))

    def invalidate(self, model: Model, preserved: frozenset[str]) -> None:
        if ALL in preserved:
            return
        for key in [k for k in self._cache if k[0] == id(model) and k[1] not in preserved]:
            del self._cache[key]


@attrs.define
class PassContext:
    """What a pass may use besides the model: analyses, data, the target's constraints, the report.

    Everything here is typed: a pass never reads the driver's options by key, and it learns what
    the target requires from `target` (qcc.target.Constraints), never from the target's name.
    """

    analyses: AnalysisManager = attrs.field(factory=AnalysisManager)
    calib_data: Any = None
    """Arrays by input name (dict), or batches from Python (qcc.data.DataStream), or None."""
    calib_name: str = "calibration data"
    """How messages name the calibration data (its file, when it came from one)."""
    overrides: tuple[str, ...] = ()
    """`--override PATTERN=TYPE` rules, applied by the apply-overrides pass."""
    target: Constraints = GENERIC
    eval_data: Any = None  # arrays by name, or a qcc.data.DataStream
    """Labelled evaluation data (`--eval`), for a pass that tunes on accuracy (accuracy-control)."""
    eval_name: str = "evaluation data"
    metric: Callable[..., float] | None = None
    """A user metric (`qcc.compile(..., metric=...)`): metric(predict) -> score, higher is better."""
    report: dict[str, Any] = attrs.field(factory=dict)
    progress: bool = False

    def note(self, key: str, entry: Any) -> None:
        """Append a line to a report section (e.g. 'float_fallbacks')."""
        self.report.setdefault(key, []).append(entry)


class Pass:
    """Base of every pass. Subclass as an `@attrs.frozen` class: its fields are its options.

    `name` is the CLI id; `requires` lists passes that must run earlier in the pipeline (or have
    run on the model already); the first docstring line is shown by `qcc passes`.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    late: ClassVar[bool] = False
    """Runs after every pass that changes annotations (memory planning, reordering): a target's
    legalization is inserted before the first late pass."""

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    @classmethod
    def doc(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def options(cls) -> list[OptionInfo]:
        """The attrs fields as options (`metadata={"help": ...}` is shown by `qcc passes`)."""
        return option_infos(cls, f"pass {cls.name!r}", cls.name)

    @classmethod
    def from_options(cls, raw: dict[str, str]) -> Pass:
        return build_options(cls, raw, f"pass {cls.name!r}", cls.name)  # type: ignore[no-any-return]
