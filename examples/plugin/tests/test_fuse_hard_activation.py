"""Tests for fuse-hard-activation, written the way a pass author would with qcc.testing.

Run with `python -m pytest examples/plugin/tests` where qcc_hardact is importable (installed, or
`PYTHONPATH=examples/plugin`). qcc's own suite runs them inside a fresh virtual environment.
"""

from __future__ import annotations

import numpy as np
import pytest
from qcc_hardact.fuse import FuseHardActivation

import qcc
from qcc import testing


def wide_feeds(model: qcc.Model) -> dict[str, np.ndarray]:
    """Inputs well beyond both clamp knees (-3 and 3)."""
    return testing.random_feeds(model, low=-9.0, high=9.0)


def torch_hardswish(graph: qcc.Graph, x: qcc.Value) -> qcc.Value:
    """x * relu6(x + 3) / 6, as torch.onnx writes it before opset 14."""
    clipped = graph.add("Clip", graph.add("Add", x, testing.constant(graph, 3.0, "three")), min=0.0, max=6.0)
    return graph.add("Div", graph.add("Mul", x, clipped), testing.constant(graph, 6.0, "six"), name="hswish")


def test_torch_hardswish_becomes_one_node_with_the_same_output() -> None:
    before = testing.make_model({"x": ("N", 16)}, torch_hardswish)
    after = testing.check_pass(before, FuseHardActivation(), wide_feeds(before))
    assert testing.op_counts(before) == {"Add": 1, "Clip": 1, "Mul": 1, "Div": 1}
    testing.assert_ir(after, """
        model "test" {
          metadata {"qcc.passes": ["fuse-hard-activation"]}
          input %x: float32[N,16]
          %hswish: float32[N,16] = HardSwish(%x) {} @"hswish"
          output %hswish
        }
    """)


def test_hard_sigmoid_with_other_bounds_and_constant_on_the_left() -> None:
    def build(graph: qcc.Graph, x: qcc.Value) -> qcc.Value:
        shifted = graph.add("Add", testing.constant(graph, 1.0, "one"), x)
        clipped = graph.add("Clip", shifted, min=0.0, max=2.0)
        return graph.add("Mul", testing.constant(graph, 0.5, "half"), clipped, name="gate")

    before = testing.make_model({"x": ("N", 3, 4)}, build)
    testing.check_pass(before, FuseHardActivation(), expect_modified=False)  # max 2 is not 6
    after = testing.check_pass(before, FuseHardActivation(max_value=2.0), wide_feeds(before))
    (node,) = after.graph.nodes
    assert (node.op, node.attrs, node.outputs[0].name) == ("HardSigmoid", {"alpha": 0.5, "beta": 0.5}, "gate")
    assert after.graph.constants == []


def test_hardswish_option_keeps_the_multiply() -> None:
    before = testing.make_model({"x": ("N", 8)}, torch_hardswish)
    after = testing.check_pass(before, FuseHardActivation(hardswish=False), wide_feeds(before))
    assert testing.op_counts(after) == {"HardSigmoid": 1, "Mul": 1}
    # and a later run with the option on finishes the job
    assert testing.op_counts(testing.check_pass(after, FuseHardActivation())) == {"HardSwish": 1}


def test_lookalikes_are_left_alone() -> None:
    def build(graph: qcc.Graph, x: qcc.Value) -> list[qcc.Value]:
        bias = graph.add_constant("bias", np.arange(8, dtype=np.float32))  # not a scalar offset
        a = graph.add("Div", graph.add("Clip", graph.add("Add", x, bias), min=0.0, max=6.0),
                      testing.constant(graph, 6.0, "six"))
        shared = graph.add("Clip", graph.add("Add", x, testing.constant(graph, 3.0, "three")), min=0.0, max=6.0)
        b = graph.add("Div", shared, testing.constant(graph, 6.0, "six"))
        return [a, b, shared]  # the second Clip is also an output: fusing would lose it

    before = testing.make_model({"x": ("N", 8)}, build)
    after = testing.check_pass(before, FuseHardActivation(), expect_modified=False)
    assert testing.op_counts(after) == testing.op_counts(before)


def test_spec_string_and_option_validation_through_the_registry() -> None:
    before = testing.make_model({"x": ("N", 8)}, torch_hardswish)
    with testing.isolated_registry():
        qcc.register_pass(FuseHardActivation)
        after = testing.check_pass(before, "fuse-hard-activation{hardswish=false,max_value=6}")
        assert testing.op_counts(after) == {"HardSigmoid": 1, "Mul": 1}
        with pytest.raises(qcc.UsageError, match="max_value must be > 0"):
            testing.run_pass(testing.clone_model(before), "fuse-hard-activation{max_value=0}")
