"""The nine light zoo graphs: import, verify, empty pipeline, write back, same outputs in ORT."""

from __future__ import annotations

import numpy as np
import pytest

from qcc.formats.onnx_export import to_onnx
from qcc.frontends.onnx import import_proto
from qcc.ir import parse_model, print_model, verify_model
from qcc.pm import PassManager
from qcc.sim import run_model
from tests.onnx_zoo import ort_run, random_input, randomized_bytes

ROUND_TRIPPED_IN_TESTS = ("squeezenet", "inception_v1", "shufflenet", "densenet121")
"""Small graphs covering the light zoo's ops; bench/model_sweeps.py runs all of LIGHT_NAMES
(the large ones, vgg19 or zfnet512, take 20 s each and add no op; docs/benchmarks.md)."""


@pytest.mark.parametrize("name", ROUND_TRIPPED_IN_TESTS)
def test_light_graph_round_trip(name: str) -> None:
    import onnx

    data = randomized_bytes(name)
    model = import_proto(onnx.load_from_string(data), name)
    assert verify_model(model) == []
    model = PassManager("").run(model).model
    (inp,) = model.graph.inputs
    x = random_input(tuple(int(d) for d in inp.type.shape))
    (ref,) = ort_run(data, {inp.name: x})
    scale = float(np.abs(ref).max())
    assert scale > 0 and np.isfinite(ref).all()

    proto = to_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == [inp.name]
    (back,) = ort_run(proto.SerializeToString(), {inp.name: x})
    assert back.shape == ref.shape
    assert np.abs(back - ref).max() <= 1e-4 * scale

    (ours,) = run_model(model, {inp.name: x}).values()
    assert np.abs(ours - ref).max() <= 1e-4 * scale
    # the outputs must carry information, or the comparison proves nothing
    assert np.ptp(ref) > 1e-3 * scale


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "shufflenet"])
def test_light_graph_text_round_trip(name: str) -> None:
    import onnx

    model = import_proto(onnx.load_from_string(randomized_bytes(name)), name)
    text = print_model(model)
    again = parse_model(text)
    assert print_model(again) == text
    assert verify_model(again) == []
    x = random_input(tuple(int(d) for d in model.graph.inputs[0].type.shape))
    a = next(iter(run_model(model, {model.graph.inputs[0].name: x}).values()))
    b = next(iter(run_model(again, {again.graph.inputs[0].name: x}).values()))
    np.testing.assert_array_equal(a, b)
