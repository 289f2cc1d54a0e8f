"""Calibration splits a batch's matrix products by samples across threads (qcc.sim.split).

BLAS runs one thread per call meanwhile (its threads spin-wait for each other, which cost a
third of the CPU beside the binning thread); each sample's result must be the bits it has when
it runs alone, whatever the batch and the split, and BLAS's own thread count is back afterwards.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest
from qcc.passes.calibrate import collect

import qcc.ir.ops.nn as nn_ops
from qcc.ir.core import Graph, Model, Value
from qcc.sim.interpreter import Interpreter
from qcc.sim.split import SplitProducts
from qcc.testing import constant, make_model
from tests.thread_spy import blas_threads, conv_threads

threadpoolctl = pytest.importorskip("threadpoolctl")


def convs_and_dense(g: Graph, x: Value) -> Value:
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    fc = rng.standard_normal((8 * 5 * 5, 10)).astype(np.float32)
    y = g.add("Relu", g.add("Conv", x, constant(g, w1, "w"), constant(g, np.ones(8, np.float32), "b"),
                            pads=[1, 1, 1, 1], strides=[2, 2]))
    y = g.add("Conv", y, constant(g, w2, "w"))
    return g.add("MatMul", g.add("Flatten", y), constant(g, fc, "fc"))


def model() -> Model:
    return make_model({"x": ("N", 3, 10, 10)}, convs_and_dense)


OUT = model().graph.outputs[0].name


def data(samples: int) -> np.ndarray:
    return np.random.default_rng(5).standard_normal((samples, 3, 10, 10)).astype(np.float32)


@pytest.mark.parametrize("threads", [2, 3])
def test_each_sample_gets_the_bits_it_has_alone(threads: int) -> None:
    from qcc.sim.split import per_sample as _per_sample

    m, x = model(), data(7)  # 7 samples: unequal parts
    alone = np.concatenate([Interpreter(m).run({"x": x[k:k + 1]})[OUT] for k in range(len(x))])
    split = SplitProducts(threads)
    try:
        kernels: dict[str, Any] = {op: split.wrap(_per_sample(Interpreter(m).kernel_for(n)))
                                   for n in m.graph.nodes for op in [n.op] if op in ("Conv", "MatMul")}
        batched = Interpreter(m, kernels=kernels).run({"x": x})[OUT]
    finally:
        split.close()
    assert batched.dtype == alone.dtype and np.array_equal(batched, alone)


def test_collect_splits_the_products_with_the_statistics_of_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    m, x = model(), data(9)
    before = blas_threads()
    ran_on = conv_threads(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    one = collect(m, {"x": x}, 3).to_dict()
    assert ran_on == {threading.current_thread().name}
    ran_on.clear()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    split = collect(m, {"x": x}, 3).to_dict()
    assert ran_on and all(name.startswith("qcc-product") for name in ran_on)
    assert split == one
    assert blas_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("qcc-product")]


def test_a_static_batch_is_rebound_to_one_sample_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """However large its activations (ResNet-50's 3 MB at 224x224 kept it at batch 1 before):
    without a batch of several samples there is nothing to split."""
    import qcc.passes.calibrate as calibrate

    static = make_model({"x": (1, 3, 10, 10)}, convs_and_dense)
    monkeypatch.setattr(calibrate, "_REBATCH_BYTES", 1)  # every activation "too large" for a wider batch
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert calibrate._rebound(static, 32) is None
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    wide = calibrate._rebound(static, 32)
    assert wide is not None and wide.graph.inputs[0].type.shape[0] == 3
    x = data(7)
    assert collect(static, {"x": x}, 1, rebatch=32).to_dict() == collect(static, {"x": x}, 1).to_dict()


@pytest.mark.parametrize("geometry", [
    {"w": (8, 6, 1, 1)},                                      # 1x1: the input is the patch matrix
    {"w": (8, 6, 3, 3), "pads": [1, 1, 1, 1], "strides": [2, 2]},  # im2col
    {"w": (3, 8, 3, 3), "pads": [1, 1, 1, 1], "c": 8},         # narrowing 3x3: by taps
    {"w": (12, 1, 3, 3), "pads": [1, 0, 1, 0], "group": 6},    # depthwise, 2 outputs per channel
])
def test_a_convolution_computed_into_a_slice_has_the_bits_it_returns(geometry: dict[str, Any]) -> None:
    """calibrate's split products write each thread's samples into the batch output (conv2d's `out`)."""
    rng = np.random.default_rng(3)
    c = geometry.get("c", 6)
    x = rng.standard_normal((5, c, 9, 9)).astype(np.float32)
    w = rng.standard_normal(geometry["w"]).astype(np.float32)
    b = rng.standard_normal(geometry["w"][0]).astype(np.float32)
    attrs = {"group": geometry.get("group", 1), "pads": geometry.get("pads", [0, 0, 0, 0]),
             "strides": geometry.get("strides", [1, 1]), "dilations": [1, 1], "kernel_shape": list(geometry["w"][2:])}
    want = np.concatenate([nn_ops.conv2d(x[k:k + 1], w, b, attrs) for k in range(len(x))])
    out = np.full(want.shape, np.nan, dtype=np.float32)
    nn_ops.conv2d(x[:2], w, b, attrs, out=out[:2])
    nn_ops.conv2d(x[2:], w, b, attrs, out=out[2:])
    assert np.array_equal(out, want)
    with pytest.raises(ValueError, match="out has shape"):
        nn_ops.conv2d(x, w, b, attrs, out=out[:2])


def test_split_convolutions_write_the_batch_output_with_the_bits_of_each_sample_alone() -> None:
    from qcc.sim.split import _WRITERS
    from qcc.sim.split import per_sample as _per_sample

    m, x = model(), data(7)
    alone = np.concatenate([Interpreter(m).run({"x": x[k:k + 1]})[OUT] for k in range(len(x))])
    split = SplitProducts(2)
    wrote: list[str] = []
    conv_into = _WRITERS["Conv"]

    def spy(node: Any, xs: list[np.ndarray], out: np.ndarray) -> None:
        wrote.append(node.op)
        conv_into(node, xs, out)

    try:
        kernels: dict[str, Any] = {op: split.wrap(_per_sample(Interpreter(m).kernel_for(n)), spy if op == "Conv" else None)
                                   for n in m.graph.nodes for op in [n.op] if op in ("Conv", "MatMul")}
        batched = Interpreter(m, kernels=kernels).run({"x": x})[OUT]
    finally:
        split.close()
    assert wrote.count("Conv") == 2 * 2  # two convolutions, two threads each
    assert np.array_equal(batched, alone)


def test_a_rebound_copy_shares_the_weights_and_leaves_the_model_alone() -> None:
    from qcc.ir.rebatch import rebatched

    static = make_model({"x": (1, 3, 10, 10)}, convs_and_dense)
    before = {v.name: (v.const, v.const.copy()) for v in static.graph.constants if v.const is not None}
    wide = rebatched(static, 4)
    assert wide is not None and wide.graph.inputs[0].type.shape[0] == 4
    assert static.graph.inputs[0].type.shape[0] == 1
    for value in wide.graph.constants:
        array, copy = before[value.name]
        assert value.const is array and np.array_equal(array, copy)
    assert all(v is not w for v, w in zip(static.graph.values(), wide.graph.values()))


@pytest.mark.parametrize("bias", ["random", "zeros", "none", "negative zero"])
def test_a_batch_norm_as_1x1_depthwise_convolution_has_the_bits_of_the_tap_sum(bias: str) -> None:
    """conv2d's channel-scale path (x * w + b) against the general depthwise kernel (its one tap
    summed onto zeros, then the bias): -0.0 products (zeros in x, negative weights) included."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6, 5, 7)).astype(np.float32)
    x[:, :, 1] = 0.0
    x[:, :, 2] = -0.0
    w = rng.standard_normal((6, 1, 1, 1)).astype(np.float32)
    w[0] = -w[0] if w[0] > 0 else w[0]
    b = {"random": rng.standard_normal(6).astype(np.float32), "zeros": np.zeros(6, np.float32), "none": None,
         "negative zero": np.array([-0.0, 1, 2, 3, 4, 5], np.float32)}[bias]
    attrs = {"group": 6, "pads": [0, 0, 0, 0], "strides": [1, 1], "dilations": [1, 1]}
    want = nn_ops._depthwise(x, w, [1, 1], [0, 0, 0, 0], [1, 1], (5, 7), 6)
    if b is not None:
        want += b.reshape(1, -1, 1, 1)
    got = nn_ops.conv2d(x, w, b, attrs)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 and +0.0 too
    out = np.empty_like(want)
    nn_ops.conv2d(x, w, b, attrs, out=out)
    assert np.array_equal(np.signbit(out), np.signbit(want)) and np.array_equal(out, want)
