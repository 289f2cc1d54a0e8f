"""Pass manager: specs, typed options, ordering, analyses cache, verification, instruments."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import attrs
import numpy as np
import pytest

from qcc.errors import UsageError, VerificationError
from qcc.ir import Graph, Model, TensorType
from qcc.pm import (
    Analysis,
    AnalysisManager,
    DumpIR,
    Pass,
    PassContext,
    PassManager,
    PassResult,
    TimePasses,
    parse_spec,
)


def small_model() -> Model:
    g = Graph("m")
    x = g.add_input("x", TensorType("float32", (1, 4)))
    y = g.add("Relu", g.add("Relu", x, name="r1"), name="r2")
    g.add("Sigmoid", x, name="dead")
    g.outputs.append(y)
    return Model(g)


class NodeCount(Analysis):
    name = "node-count"
    runs: ClassVar[int] = 0

    def compute(self, model: Model, am: AnalysisManager) -> int:
        NodeCount.runs += 1
        return len(model.graph.nodes)


@attrs.frozen
class Tag(Pass):
    """Write a tag into the metadata."""

    name = "tag"
    label: str = "x"
    times: int = 1
    mode: Literal["a", "b"] = "a"
    ops: tuple[str, ...] = ("Relu",)
    keep_counts: bool = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        model.metadata["tag"] = (self.label * self.times, self.mode, self.ops)
        preserved = frozenset({"node-count"}) if self.keep_counts else frozenset()
        return PassResult(model, True, preserved)


@attrs.frozen
class NeedsTag(Pass):
    """Needs tag first."""

    name = "needs-tag"
    requires = ("tag",)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        return PassResult.unchanged(model)


@attrs.frozen
class Breaks(Pass):
    """Leaves a wrong type behind."""

    name = "breaks"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        model.graph.nodes[0].outputs[0].type = TensorType("float32", (9,))
        return PassResult(model, True)


def test_spec_parsing_and_errors() -> None:
    specs = parse_spec('fold-bn,insert-quantize{after=Relu|AvgPool,exclude="a,b"},calibrate{method=entropy}')
    assert [s.name for s in specs] == ["fold-bn", "insert-quantize", "calibrate"]
    assert dict(specs[1].options) == {"after": "Relu|AvgPool", "exclude": "a,b"}
    for bad, where in [("a,,b", "expected a pass name"), ("a{x}", "expected '='"), ("a{x=1", "expected ','"),
                       ("a b", "expected ','"), ("a,", "trailing"), ("a{x=1,x=2}", "given twice")]:
        with pytest.raises(UsageError, match=where):
            parse_spec(bad)


def test_typed_options_from_fields() -> None:
    infos = {o.name: o for o in Tag.options()}
    assert infos["times"].type_text == "int" and infos["times"].default == 1
    assert infos["mode"].type_text == "a|b"
    assert infos["ops"].type_text == "list[str]"
    p = Tag.from_options({"label": "q", "times": "3", "mode": "b", "ops": "Relu|AvgPool", "keep_counts": "false"})
    assert p == Tag("q", 3, "b", ("Relu", "AvgPool"), False)
    with pytest.raises(UsageError, match="'x3' is not a int"):
        Tag.from_options({"times": "x3"})
    with pytest.raises(UsageError, match=r"one of a\|b"):
        Tag.from_options({"mode": "c"})
    with pytest.raises(UsageError, match="has no option 'colour'"):
        Tag.from_options({"colour": "red"})


def test_unknown_pass_in_spec_names_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown pass 'no-such-pass' \(known: .*dce"):
        PassManager("dce,no-such-pass")


def test_ordering_is_checked_before_running_and_names_both() -> None:
    model = small_model()
    with pytest.raises(UsageError, match="'needs-tag' requires 'tag' to run before it, but 'tag' runs after it"):
        PassManager([NeedsTag(), Tag()]).run(model)
    assert "tag" not in model.metadata
    with pytest.raises(UsageError, match="'tag' is missing from the pipeline"):
        PassManager([NeedsTag()]).run(model)
    PassManager([Tag(), NeedsTag()]).run(model)
    # a model that already went through `tag` satisfies the contract later on
    PassManager([NeedsTag()]).run(model)


def test_analyses_are_cached_and_invalidated() -> None:
    model = small_model()
    ctx = PassContext()
    NodeCount.runs = 0
    assert ctx.analyses.get(NodeCount, model) == 3
    assert ctx.analyses.get(NodeCount, model) == 3 and NodeCount.runs == 1
    PassManager([Tag(keep_counts=True)]).run(model, ctx)
    assert ctx.analyses.cached("node-count", model)
    PassManager([Tag(keep_counts=False)]).run(model, ctx)
    assert not ctx.analyses.cached("node-count", model)
    PassManager("dce").run(model, ctx)
    assert ctx.analyses.get(NodeCount, model) == 2 and NodeCount.runs == 2


def test_verification_after_each_pass_names_the_pass() -> None:
    with pytest.raises(VerificationError, match="after pass 'breaks'"):
        PassManager([Breaks()]).run(small_model())
    PassManager([Breaks()], verify=False).run(small_model())


def test_instruments_time_and_dump(tmp_path: Path) -> None:
    timer = TimePasses()
    model = small_model()
    PassManager("dce,fold-constants", instruments=[timer, DumpIR(tmp_path)]).run(model)
    assert [n for n, _ in timer.times] == ["dce", "fold-constants"]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["00-input.qir", "01-dce.qir", "02-fold-constants.qir"]
    assert "Sigmoid" in (tmp_path / "00-input.qir").read_text()
    assert "Sigmoid" not in (tmp_path / "01-dce.qir").read_text()
    assert model.passes_run == ["dce", "fold-constants"]


def test_fold_constants_evaluates_constant_subgraphs() -> None:
    g = Graph("g")
    x = g.add_input("x", TensorType("float32", (2,)))
    c = g.add("Mul", g.add_constant("a", np.array([1.0, 2.0], np.float32)),
              g.add_constant("b", np.array([3.0, 4.0], np.float32)), name="cm")
    g.outputs.append(g.add("Add", x, c, name="out"))
    model = Model(g)
    PassManager("fold-constants").run(model)
    assert [n.op for n in g.nodes] == ["Add"]
    np.testing.assert_array_equal(g.nodes[0].inputs[1].const, [3.0, 8.0])
