"""The bundled digits example: the committed files are sound and train.py reproduces them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits"
MIN_ACCURACY = 0.95


def _load_train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _onnx_accuracy(model_path: Path, test_npz: Path) -> float:
    import onnxruntime as ort

    data = np.load(test_npz)
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {"x": data["x"]})[0]
    return float(np.mean(np.asarray(logits).argmax(axis=1) == data["labels"]))


def test_committed_model_is_valid_and_accurate() -> None:
    import onnx

    model = onnx.load(str(EXAMPLE / "digits_cnn.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N"
    ops = {n.op_type for n in model.graph.node}
    # the features the example exists to exercise in qcc's passes
    assert {
        "Conv",
        "BatchNormalization",
        "Relu",
        "Add",
        "Concat",
        "MaxPool",
        "AveragePool",
        "Flatten",
        "Gemm",
    } <= ops
    assert _onnx_accuracy(EXAMPLE / "digits_cnn.onnx", EXAMPLE / "test.npz") >= MIN_ACCURACY


def test_committed_splits_match_the_script() -> None:
    splits = _load_train_module().load_splits(seed=0)
    calib = np.load(EXAMPLE / "calib.npz")
    test = np.load(EXAMPLE / "test.npz")
    assert calib["x"].dtype == np.float32 and test["x"].dtype == np.float32
    assert test["labels"].dtype == np.int64
    np.testing.assert_array_equal(calib["x"], splits["calib"][0])
    np.testing.assert_array_equal(test["x"], splits["test"][0])
    np.testing.assert_array_equal(test["labels"], splits["test"][1])
    assert calib["x"].shape == (359, 1, 8, 8) and test["x"].shape == (360, 1, 8, 8)


def test_retraining_reaches_accuracy(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # 3 epochs take under a second on 2 cores and already clear the bar with margin; on one
    # thread: OpenMP's second thread spins on a loaded machine (70 s instead of 16 s measured)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = _load_train_module().train(tmp_path, epochs=3, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert result["max_abs_diff"] < 1e-4
    assert result["parameters"] < 30_000
    assert _onnx_accuracy(tmp_path / "digits_cnn.onnx", tmp_path / "test.npz") >= MIN_ACCURACY
