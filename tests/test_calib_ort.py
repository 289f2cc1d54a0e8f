"""calibrate{engine=onnxruntime}'s session (qcc.runtimes.onnxruntime.calibration_session).

The session hands onnxruntime the large weights as the IR's arrays instead of serializing them,
runs with graph optimizations up to 'extended' and threads that do not spin: none of that may
change a value. The oracle is the session calibration ran before (weights serialized, graph
optimizations off, onnxruntime's default threads): the statistics must be the same bit for bit.
With one engine they must also not depend on the batch a model runs at or on onnxruntime's
thread count (issue 19: "bit-identical whichever engine and batch size ran them").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.passes.calibrate import collect

import qcc.runtimes.onnxruntime as ort_runtime
from qcc.driver import load
from qcc.ir.core import Model
from qcc.pm.parallel import worker_budget
from qcc.testing import make_model
from tests.test_calib_fast import dense_block
from tests.test_calib_scale import static_batch_onnx

pytest.importorskip("onnxruntime")

SAMPLES = 11  # not a multiple of the rebound batch


def _serialized_session(proto: Any, arrays: Any = None) -> ort_runtime.CalibrationSession:
    """What calibrate{engine=onnxruntime} ran before: every weight in the serialized model,
    graph optimizations off, spinning threads (one: more change the sums, see below)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return ort_runtime.CalibrationSession(session, {})


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    # 32 channels: the 3x3 convolution's weights (36 KB) are shared, the classifier's (1.3 KB) inline
    return load(str(static_batch_onnx(tmp_path_factory.mktemp("ort") / "tail.onnx", channels=32)))


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    x = np.random.default_rng(5).standard_normal((SAMPLES, 3, 12, 12)).astype(np.float32)
    x[4] *= 16  # a batch that widens every histogram
    return {"x": x}


def test_shared_weights_and_optimizations_change_no_statistic(model: Model, data: dict[str, np.ndarray],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shared: list[set[str]] = []
    original = ort_runtime.calibration_session

    def spy(proto: Any, arrays: Any = None) -> ort_runtime.CalibrationSession:
        session = original(proto, arrays)
        assert arrays is not None and all(session.weights[name] is arrays[name] for name in session.weights)
        shared.append(set(session.weights))
        return session

    monkeypatch.setattr(ort_runtime, "calibration_session", spy)
    new = collect(model, data, 1, engine="onnxruntime", rebatch=4).to_dict()
    assert shared and all(names == {"w2"} for names in shared)  # w1 (324 B) and fc (1.3 KB) stay inline
    monkeypatch.setattr(ort_runtime, "calibration_session", _serialized_session)
    old = collect(model, data, 1, engine="onnxruntime", rebatch=4).to_dict()
    assert new == old


def test_statistics_do_not_depend_on_batch_or_worker_budget(model: Model, data: dict[str, np.ndarray]) -> None:
    """The session runs one thread whatever the budget: at 2 threads and batch 1 onnxruntime's
    3x3 convolution sums in another order (c2 differs in its last bits from batch 4 or 1 thread)."""
    runs = []
    for threads in (None, 1, 2):
        with worker_budget(threads):
            runs.append(collect(model, data, 1, engine="onnxruntime").to_dict())  # batch 1, the model's
            runs.append(collect(model, data, 1, engine="onnxruntime", rebatch=4).to_dict())  # rebound to 4
    assert runs[0]["samples"] == SAMPLES
    assert all(run == runs[0] for run in runs[1:])


def test_a_dynamic_batch_gives_the_same_statistics_at_any_batch() -> None:
    model = make_model({"x": ("N", 3, 6, 6)}, dense_block)
    x = np.random.default_rng(6).standard_normal((SAMPLES, 3, 6, 6)).astype(np.float32)
    x[3] *= 8
    runs = [collect(model, {"x": x}, batch, engine="onnxruntime").to_dict() for batch in (1, 4, SAMPLES)]
    assert runs[0] == runs[1] == runs[2]


def test_a_model_without_large_weights_runs_inline(tmp_path: Path, data: dict[str, np.ndarray]) -> None:
    small = load(str(static_batch_onnx(tmp_path / "small.onnx")))  # 8 channels: every weight under 4 KB
    assert collect(small, data, 1, engine="onnxruntime").samples == SAMPLES
