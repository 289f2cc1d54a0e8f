"""Calibration of a static-batch model runs whole batches on threads of their own (passes/calibrate.py,
`_SampleThreads`): the statistics must be `collect_batches`'s bit for bit (the signs of zero
minima included, which depend on the order values are met), errors must surface as before, and
BLAS's thread count and the threads themselves must be gone afterwards.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from qcc.passes import calibrate
from qcc.passes.calibrate import collect, collect_batches

import qcc.ir.ops.nn as nn_ops
from qcc.errors import InvalidInputError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.samples import to_model
from qcc.quant.stats import TensorStats
from qcc.testing import constant, make_model
from tests.thread_spy import blas_threads, conv_threads

threadpoolctl = pytest.importorskip("threadpoolctl")


def layers(g: Graph, x: Value) -> Value:
    """Conv -> Relu (derived from its input's bins), a residual Add, a Concat (merged, not observed),
    pooling and a Dense: every way the observer treats a tensor."""
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    fc = rng.standard_normal((16 * 5 * 5, 10)).astype(np.float32)
    a = g.add("Relu", g.add("Conv", x, constant(g, w1, "w1"), constant(g, np.ones(8, np.float32), "b1"),
                            pads=[1, 1, 1, 1], strides=[2, 2]))
    b = g.add("Conv", a, constant(g, w2, "w2"), constant(g, -np.ones(8, np.float32), "b2"))
    c = g.add("Relu", g.add("Add", a, b))
    y = g.add("Concat", a, c, axis=1)
    return g.add("MatMul", g.add("Flatten", g.add("MaxPool", y, kernel=[1, 1])), constant(g, fc, "fc"))


def static_model() -> Model:
    return make_model({"x": (1, 3, 10, 10)}, layers)


def exact(result: Any) -> str:
    """The statistics as text: repr tells -0.0 from 0.0 (== does not)."""
    return repr(result.to_dict())


def sequential(model: Model, x: np.ndarray, rebatch: int, pre_bias: frozenset[str] = frozenset()) -> Any:
    """What collect_batches computes: one batch at a time (products split over the threads)."""
    batches = (to_model(model, {"x": x[k:k + 1]}) for k in range(len(x)))
    return collect_batches(model, batches, len(x), rebatch=rebatch, pre_bias=pre_bias)


@pytest.mark.parametrize("cores", [2, 3])
@pytest.mark.parametrize(("samples", "rebatch"), [(1, 2), (5, 2), (8, 2), (13, 3), (13, 32), (70, 32)])
@pytest.mark.parametrize("pre_bias", [frozenset(), frozenset({"Conv"})])
def test_threads_give_the_statistics_of_one_batch_at_a_time(monkeypatch: pytest.MonkeyPatch, cores: int,
                                                            samples: int, rebatch: int, pre_bias: frozenset[str]) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    m = static_model()
    x = np.random.default_rng(samples).standard_normal((samples, 3, 10, 10)).astype(np.float32)
    before = blas_threads()
    ran_on = conv_threads(monkeypatch)
    threaded = collect(m, {"x": x}, 1, rebatch=rebatch, pre_bias=pre_bias)
    assert any(name.startswith("qcc-calibrate") for name in ran_on) or samples < 2 * rebatch
    assert not any(name.startswith("qcc-product") for name in ran_on)  # no per-layer hand-offs
    assert blas_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith(("qcc-calibrate", "qcc-product"))]
    ran_on.clear()
    assert exact(threaded) == exact(sequential(m, x, rebatch, pre_bias))
    assert threaded.samples == samples


def test_the_signs_of_zero_minima_are_those_of_the_batch_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's min keeps the first of equal values: a tensor whose minimum is 0.0 in some batches and
    -0.0 in others ends with the first batch's sign, so the batches are folded in their order."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    m = static_model()
    rng = np.random.default_rng(0)
    for first in (0.0, -0.0):
        x = np.abs(rng.standard_normal((12, 3, 10, 10))).astype(np.float32) + 1
        x[:, 0, 0, 0] = [first if k < 2 else -first for k in range(12)]
        threaded = collect(m, {"x": x}, 1, rebatch=2)
        assert repr(threaded.get("x").min) == repr(first)  # type: ignore[union-attr]
        assert exact(threaded) == exact(sequential(m, x, 2))


def test_an_error_in_a_thread_is_raised_once_every_thread_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    m = static_model()
    x = np.random.default_rng(1).standard_normal((9, 3, 10, 10)).astype(np.float32)
    calls = []
    conv2d = nn_ops.conv2d

    def failing(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        if len(calls) == 5:
            raise ValueError("boom")
        return conv2d(*args, **kwargs)

    monkeypatch.setattr(nn_ops, "conv2d", failing)
    before = blas_threads()
    with pytest.raises(InvalidInputError, match="failed to execute: boom"):
        collect(m, {"x": x}, 1, rebatch=2)
    assert blas_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("qcc-calibrate")]


def test_one_core_many_cores_or_a_dynamic_batch_keep_one_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    run = calibrate._SampleThreads.run

    def spy(self: Any, *args: Any) -> Any:
        started.append(self.threads)
        return run(self, *args)

    monkeypatch.setattr(calibrate._SampleThreads, "run", spy)
    x = np.random.default_rng(1).standard_normal((4, 3, 10, 10)).astype(np.float32)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    collect(static_model(), {"x": x}, 1, rebatch=32)
    monkeypatch.setattr(os, "cpu_count", lambda: calibrate._SAMPLE_THREADS + 1)  # memory: products split instead
    collect(static_model(), {"x": x}, 1, rebatch=32)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    collect(make_model({"x": ("N", 3, 10, 10)}, layers), {"x": x}, 4, rebatch=32)
    assert started == []
    collect(static_model(), {"x": x}, 1, rebatch=32)
    assert started == [2]


VALUES = st.floats(-1e6, 1e6, allow_nan=False, width=32) | st.sampled_from([0.0, -0.0, 2.0**-120, -(2.0**-110)])
ARRAYS = hnp.arrays(np.float32, st.integers(1, 40), elements=VALUES)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(ARRAYS, min_size=1, max_size=5), num_bins=st.sampled_from([2, 8, 2048]))
def test_absorb_is_merge_in_place(parts: list[np.ndarray], num_bins: int) -> None:
    separate = [TensorStats("t", num_bins).update(p) for p in parts]
    merged = functools.reduce(TensorStats.merge, separate, TensorStats("t", num_bins))
    folded = TensorStats("t", num_bins)
    for part in separate:
        folded.absorb(part)
    assert repr(folded.to_dict()) == repr(merged.to_dict())
    assert repr(separate[0].to_dict()) == repr(TensorStats("t", num_bins).update(parts[0]).to_dict())  # unchanged


def test_absorb_keeps_channels_and_refuses_what_merge_refuses() -> None:
    a = TensorStats("t", 8, channel_axis=1).update(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = TensorStats("t", 8, channel_axis=1).update(-np.arange(6, dtype=np.float32).reshape(2, 3) * 100)
    merged = a.merge(b)
    a.absorb(b)
    assert repr(a.to_dict()) == repr(merged.to_dict())
    with pytest.raises(Exception, match="cannot merge"):
        a.absorb(TensorStats("u", 8, channel_axis=1))
    with pytest.raises(Exception, match="cannot merge"):
        a.absorb(TensorStats("t", 16, channel_axis=1))


def test_a_failing_fold_stops_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    absorb = calibrate._Observer.absorb
    calls: list[int] = []

    def failing(self: Any, other: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("fold failed")
        absorb(self, other)

    monkeypatch.setattr(calibrate._Observer, "absorb", failing)
    x = np.random.default_rng(1).standard_normal((12, 3, 10, 10)).astype(np.float32)
    with pytest.raises(RuntimeError, match="fold failed"):
        collect(static_model(), {"x": x}, 1, rebatch=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("qcc-calibrate")]
