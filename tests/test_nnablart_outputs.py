"""qcc's nnablart runtime (qcc.runtimes.nnablart) reads each output in the shape the .nnb declares,
also when the batch of 1 is not on axis 0 (a (T, N, C) sequence output, as CRNN OCR models end)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.ir import Graph, Model, TensorType
from qcc.runtimes.base import FLOAT, bind_by_position
from tests.nnb_util import nnablart


def sequence_first() -> Model:
    g = Graph("tnc")
    x = g.add_input("x", TensorType("float32", (1, 6, 5)))
    g.outputs = [g.add("Transpose", g.add("Relu", x), perm=[1, 0, 2], name="tnc")]  # (6, 1, 5)
    return Model(g)


@pytest.mark.skipif(nnablart() is None, reason="no nnablart build (set QCC_NNABLART)")
def test_an_output_with_its_batch_on_axis_1_reads_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qcc.backends.nnb.runtime import nnb_runtime

    binary = nnablart()
    assert binary is not None
    monkeypatch.setenv("QCC_NNABLART", binary)
    qcc.compile(sequence_first(), tmp_path / "tnc.nnb")
    x = np.random.default_rng(2).standard_normal((1, 6, 5)).astype(np.float32)
    with nnb_runtime(tmp_path / "tnc.nnb", FLOAT) as runtime:
        assert runtime.name.startswith("nnabla-c-runtime")
        (got,) = runtime.run(bind_by_position(runtime, {"x": x})).values()
    np.testing.assert_array_equal(got, qcc.run(sequence_first(), {"x": x})["tnc"])
