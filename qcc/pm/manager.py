"""The pass manager: runs an ordered pipeline with order checks, verification and instruments."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qcc.errors import InternalError, QccError, UsageError, VerificationError
from qcc.ir.core import Model
from qcc.ir.verify import verify_model
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.pm.instruments import Instrument
from qcc.pm.spec import PassSpec, parse_spec


def build_passes(spec: str | Sequence[PassSpec | Pass]) -> list[Pass]:
    """Instantiate passes from a spec string (or specs) through the plugin registry."""
    from qcc.plugins import registry

    items: Iterable[PassSpec | Pass] = parse_spec(spec) if isinstance(spec, str) else spec
    passes: list[Pass] = []
    for item in items:
        if isinstance(item, Pass):
            passes.append(item)
            continue
        cls = registry().pass_class(item.name)
        passes.append(cls.from_options(dict(item.options)))
    return passes


def check_order(passes: Sequence[Pass], already_run: Iterable[str] = (), needed_by: dict[str, tuple[str, ...]] | None = None) -> None:
    """Every pass's `requires` must appear earlier (or have run on the model); names both on error."""
    seen = set(already_run)
    for p in passes:
        for required in p.requires:
            if required not in seen:
                later = any(q.name == required for q in passes)
                where = "runs after it" if later else "is missing from the pipeline"
                raise UsageError(f"pass {p.name!r} requires {required!r} to run before it, but {required!r} {where}")
        seen.add(p.name)
    for who, requirements in (needed_by or {}).items():
        for required in requirements:
            if required not in seen:
                raise UsageError(f"{who} requires pass {required!r}, which is missing from the pipeline")


class PassManager:
    def __init__(
        self,
        passes: str | Sequence[PassSpec | Pass] = (),
        verify: bool = True,
        instruments: Sequence[Instrument] = (),
    ) -> None:
        self.passes = build_passes(passes)
        self.verify = verify
        self.instruments = list(instruments)

    def add(self, p: Pass) -> PassManager:
        self.passes.append(p)
        return self

    @property
    def spec(self) -> str:
        return ",".join(p.name for p in self.passes)

    def run(self, model: Model, ctx: PassContext | None = None) -> PassResult:
        ctx = ctx or PassContext()
        check_order(self.passes, model.passes_run)
        modified = False
        for index, p in enumerate(self.passes):
            for inst in self.instruments:
                inst.before(index, p, model)
            try:
                result = p.run(model, ctx)
            except QccError:
                raise
            except Exception as exc:  # a bug in a pass: report it as such, naming the pass
                raise InternalError(f"pass {p.name!r} crashed: {type(exc).__name__}: {exc}") from exc
            if not isinstance(result, PassResult):
                raise InternalError(f"pass {p.name!r} returned {type(result).__name__}, not PassResult")
            model = result.model
            model.passes_run.append(p.name)
            modified |= result.modified
            ctx.analyses.invalidate(model, result.preserved if result.modified else frozenset({"*"}))
            if self.verify:
                problems = verify_model(model)
                if problems:
                    raise VerificationError(problems, f"after pass {p.name!r}")
            for inst in self.instruments:
                inst.after(index, p, model, result)
        return PassResult(model, modified, frozenset())
