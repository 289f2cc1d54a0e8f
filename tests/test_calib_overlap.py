"""Calibration histograms one activation while the model computes the next (qcc.sim.background).

The binning runs on a thread of its own, in the order the tensors were computed, so the
statistics are those of observing inline (tests/test_calib_fast.py's oracle); an error raised
while binning reaches the caller, and no thread outlives the call.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from qcc.passes.calibrate import collect

from qcc.errors import InvalidInputError
from qcc.ir.core import Value
from qcc.quant.stats import TensorStats
from qcc.sim.background import BackgroundObserver
from qcc.testing import make_model
from tests.test_calib_fast import dense_block, observe_everything


def model_and_data() -> tuple[Any, np.ndarray]:
    model = make_model({"x": ("N", 3, 6, 6)}, dense_block)
    data = np.random.default_rng(4).standard_normal((9, 3, 6, 6)).astype(np.float32)
    data[2] *= 16  # a batch that widens every histogram
    return model, data


@pytest.mark.parametrize("engine", ["qcc", "onnxruntime"])
def test_binning_runs_beside_the_model_with_the_inline_statistics(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, data = model_and_data()
    threads: set[str] = set()
    add = TensorStats.add

    def spy(self: TensorStats, batch: Any) -> Any:
        threads.add(threading.current_thread().name)
        return add(self, batch)

    monkeypatch.setattr(TensorStats, "add", spy)
    before = threading.active_count()
    got = collect(model, {"x": data}, 2, engine=engine).to_dict()
    assert threads == {"qcc-observer"}
    assert threading.active_count() == before
    if engine == "qcc":  # onnxruntime's kernels round differently (tests/test_calib_scale.py)
        assert got == observe_everything(model, data, 2)


def test_an_error_while_binning_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    model, data = model_and_data()
    add = TensorStats.add

    def failing(self: TensorStats, batch: Any) -> Any:
        if self.name == next(n for n in model.graph.nodes if n.op == "Conv").outputs[0].name:
            raise InvalidInputError(f"tensor {self.name!r}: refused")
        return add(self, batch)

    monkeypatch.setattr(TensorStats, "add", failing)
    before = threading.active_count()
    with pytest.raises(InvalidInputError, match="refused"):
        collect(model, {"x": data}, 2)
    assert threading.active_count() == before


def test_background_observer_keeps_the_call_order_and_the_first_error() -> None:
    seen: list[Any] = []

    def observer(value: Value, array: np.ndarray) -> None:
        if int(array[0]) == 3:
            raise ValueError("three")
        seen.append(int(array[0]))

    with BackgroundObserver(observer, depth=2) as background:
        value = Value.constant("v", np.zeros(1, np.float32))
        for i in range(3):
            background(value, np.array([i]))
        background.call(lambda: seen.append(-1))
        background.drain()
        assert seen == [0, 1, 2, -1]
        for i in range(3, 6):  # 3 fails: the calls after it are skipped, drain raises it once
            background(value, np.array([i]))
        with pytest.raises(ValueError, match="three"):
            background.drain()
        assert seen == [0, 1, 2, -1]
        background(value, np.array([7]))
        background.drain()
        assert seen == [0, 1, 2, -1, 7]


def test_a_cluster_job_leaves_its_weights_out_by_content() -> None:
    """What `qcc.pm.cluster` ships: the job without its large arrays, which come back (read-only)
    on the worker; equal contents share one key, a changed weight gets another (never stale)."""
    from qcc.pm.cluster import SHARED_BYTES, content_key, pickled_job, run_job

    big = np.arange(SHARED_BYTES // 4, dtype=np.float32)
    small = np.ones(4, np.float32)
    blob, arrays = pickled_job((lambda xs: [float(x.sum()) for x in xs], [big, big.copy(), small]))
    assert list(arrays) == [content_key(big)] and len(blob) < SHARED_BYTES // 4
    changed = big.copy()
    changed[-1] += 1
    assert content_key(changed) != content_key(big)
    shipped = {k: v.copy() for k, v in arrays.items()}
    assert run_job(blob, shipped) == [float(big.sum())] * 2 + [4.0]
    assert not next(iter(shipped.values())).flags.writeable
