"""Issue 17 item 3: the corpus harness (bench/corpus.py) on models built here, never downloaded.

The real corpus runs in bench/; this checks what its table rests on: a model with dynamic dims and
a Shape -> Reshape chain compiled with --input-shape to C float (against onnxruntime), onnx-qdq
int8 and C int8 (bit-exact with qcc's integer simulator), and onnxruntime's quantize_static run
here on the same data; a model with an op qcc lacks gives one line naming it on every target.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.corpus import blockers, evaluate, markdown
from bench.corpus_inputs import normalize
from bench.corpus_models import CorpusModel, Package

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _classifier(path: Path, extra_op: str | None = None) -> Path:
    """x[batch, 3, height, width] -> Conv -> Relu -> GlobalAveragePool -> Shape/Gather/Concat/Reshape
    -> Gemm -> logits (random weights); `extra_op` adds one node of that type before the Gemm."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "b": rng.normal(0, 0.1, 8).astype(np.float32),
              "fc": rng.normal(0, 0.5, (5, 8)).astype(np.float32), "fcb": np.zeros(5, np.float32),
              "i0": np.array(0, np.int64), "ax0": np.array([0], np.int64), "m1": np.array([-1], np.int64)}
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Relu", ["c"], ["r"]), h.make_node("GlobalAveragePool", ["r"], ["g"]),
             h.make_node("Shape", ["g"], ["s"]), h.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             h.make_node("Unsqueeze", ["n", "ax0"], ["nu"]), h.make_node("Concat", ["nu", "m1"], ["shp"], axis=0),
             h.make_node("Reshape", ["g", "shp"], ["f"])]
    last = "f"
    if extra_op:
        nodes.append(h.make_node(extra_op, ["f"], ["e"], name="odd_one"))
        last = "e"
    nodes.append(h.make_node("Gemm", [last, "fc", "fcb"], ["logits"], transB=1))
    graph = h.make_graph(nodes, "tiny", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, "height", "width"])],
                         [h.make_tensor_value_info("logits", T.FLOAT, None)],
                         [nh.from_array(v, k) for k, v in consts.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def _data(model: CorpusModel, count: int, offset: int) -> dict[str, np.ndarray]:
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(offset)
    photos = load_sample_images().images
    crops = []
    for _ in range(count):
        img = photos[int(rng.integers(len(photos)))]
        y, x = int(rng.integers(0, img.shape[0] - 100)), int(rng.integers(0, img.shape[1] - 100))
        crops.append(img[y:y + 100, x:x + 100])
    return {"x": normalize(crops, model.shapes["x"], "NCHW", (0.5,) * 3, (0.25,) * 3, False)}


TINY = CorpusModel("tiny", Package("built-in-test", "0"), "", "classification", {"x": (1, 3, 24, 32)}, "photo",
                   "class")


def test_harness_row_on_a_dynamic_model(tmp_path: Path) -> None:
    path = _classifier(tmp_path / "tiny.onnx")
    row = evaluate(TINY, path, _data(TINY, 12, 0), _data(TINY, 6, 100), tmp_path, ("minmax",), ("MinMax",))
    assert row["c_float"]["ok"] and row["c_float"]["pass"], row["c_float"]
    assert row["c_float"]["max_rel_err"] <= 1e-4
    assert row["qdq"]["ok"] and 10 < row["qdq"]["sqnr_db"] < 200, row["qdq"]
    assert row["c_int8"]["ok"] and row["c_int8"]["bit_exact"], row["c_int8"]
    assert row["ort"]["ok"] and np.isfinite(row["ort"]["sqnr_db"]), row["ort"]
    assert row["ort"]["method"] == "MinMax" and row["qdq"]["method"] == "minmax"
    assert row["qdq"]["task"].endswith("same class")
    table = markdown([row])
    assert "| tiny (built-in-test==0) | `x=1,3,24,32` |" in table and "pass" in table


def test_harness_names_the_op_that_blocks_a_model(tmp_path: Path) -> None:
    path = _classifier(tmp_path / "odd.onnx", extra_op="Hardmax")
    row = evaluate(TINY, path, _data(TINY, 4, 0), _data(TINY, 2, 100), tmp_path, ("minmax",), ("MinMax",))
    for target in ("c_float", "qdq", "c_int8", "nnb"):
        assert not row[target]["ok"] and "Hardmax" in row[target]["reason"] and "odd_one" in row[target]["reason"]
        assert "\n" not in row[target]["reason"]
    assert markdown([row]).count("fails: no importer: Hardmax") == 4
    assert blockers([row]) == {"Hardmax": ["tiny/c_float", "tiny/qdq", "tiny/c_int8", "tiny/nnb"]}
