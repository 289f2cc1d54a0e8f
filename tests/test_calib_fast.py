"""Calibration that skips derivable passes over the data, checked against observing everything.

`collect` merges a Concat's (or reshape's) input statistics instead of reading its output, and
accounts a Relu output from its input's histogram of the same batch (TensorStats.add_relu_of)
when the bins line up. The oracle is TensorStats.update on every tensor the interpreter computes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from qcc.passes.calibrate import collect

from qcc.ir.core import Graph, Model, Value
from qcc.quant.stats import TensorStats
from qcc.sim.interpreter import Interpreter
from qcc.testing import constant, make_model


def observe_everything(model: Model, data: np.ndarray, batch: int, num_bins: int = 2048) -> dict[str, Any]:
    values = [*model.graph.inputs, *(v for n in model.graph.nodes for v in n.outputs)]
    stats = {v.name: TensorStats(v.name, num_bins) for v in values}
    interp = Interpreter(model, keep_all=True)
    for start in range(0, len(data), batch):
        feed = {"x": data[start:start + batch]}
        computed = {**feed, **interp.run(feed)}
        for v in values:
            stats[v.name].update(computed[v.name])
    return {"samples": len(data), "stats": [s.to_dict() for s in stats.values()]}


def conv(g: Graph, x: Value, cin: int, cout: int, bias: float, seed: int) -> Value:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin, 3, 3)) / 3).astype(np.float32)
    return g.add("Conv", x, constant(g, w, "w"), constant(g, np.full(cout, bias, np.float32), "b"), pads=[1, 1, 1, 1])


def dense_block(g: Graph, x: Value) -> Value:
    """DenseNet-like: growing Concats, Relus whose input reaches further up (bins line up) or
    further down (they do not: the output must be read), a reshape, a Concat of Concats."""
    a = g.add("Relu", conv(g, x, 3, 4, 0.5, 1))  # mostly positive input
    b = g.add("Relu", conv(g, a, 4, 4, -8.0, 2))  # mostly negative input: finer bins than its input's
    c1 = g.add("Concat", x, a, b, axis=1)
    r = g.add("Relu", c1)  # Relu of a derived tensor
    c2 = g.add("Concat", c1, g.add("Relu", x), r, axis=1)
    flat = g.add("Flatten", g.add("MaxPool", c2, kernel=[2, 2], strides=[2, 2]))
    return g.add("Concat", flat, g.add("Reshape", flat, shape=[0, -1]), axis=1)


def test_collect_equals_observing_every_tensor() -> None:
    model = make_model({"x": ("N", 3, 6, 6)}, dense_block)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((11, 3, 6, 6)).astype(np.float32)
    data[3] *= 8  # a batch that widens every histogram
    data[5, 0] = 0.0  # exact zeros in an input that a Relu reads
    derived = []
    original = TensorStats.add_relu_of

    def spy(self: TensorStats, source: Any) -> bool:
        derived.append(original(self, source))
        return derived[-1]

    TensorStats.add_relu_of = spy  # type: ignore[method-assign]
    try:
        got = collect(model, {"x": data}, 4).to_dict()
    finally:
        TensorStats.add_relu_of = original  # type: ignore[method-assign]
    assert got == observe_everything(model, data, 4)
    assert True in derived and False in derived  # both the shortcut and the fallback were taken


F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
BATCH = hnp.arrays(np.float32, st.integers(0, 200), elements=st.one_of(F32, st.sampled_from([0.0, -0.0])))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(BATCH, min_size=1, max_size=4), num_bins=st.sampled_from([2, 16, 2048]),
       shift=st.floats(-4, 4))
def test_relu_from_input_counts_equals_observing_the_relu(batches: list[np.ndarray], num_bins: int,
                                                          shift: float) -> None:
    x_stats, direct, derived = (TensorStats(n, num_bins) for n in ("x", "y", "y"))
    for x in batches:
        x = (x + np.float32(shift)).astype(np.float32) if shift else x
        if not np.isfinite(x).all():
            continue
        y = np.maximum(x, 0).astype(np.float32)
        direct.update(y)
        counts = x_stats.add(x)
        if counts is None or not derived.add_relu_of(counts):
            derived.update(y)
        assert derived.to_dict() == direct.to_dict()
