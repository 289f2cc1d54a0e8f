"""Issue 20: every ONNX element type is decoded exactly (checked against onnxruntime) or refused by name.

A constant of each type, stored both as raw bytes and in the typed protobuf field, feeds
Cast(to=float) -> Add. qcc's import must give exactly onnxruntime's result: decoding is exact
(every bfloat16, float8, int4 value is a float32 value), so the comparison is bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import qcc
from qcc.errors import UnsupportedError

# values every type can hold exactly, plus each type's awkward corners
VALUES = {
    TensorProto.BFLOAT16: [1.5, -3.0, 0.0078125, 3.0e38, -0.0, 1e-39, 2.0, 100.0],
    TensorProto.FLOAT16: [1.5, -3.0, 0.0009765625, 65504.0, -0.0, 6e-8, 2.0, 100.0],
    TensorProto.FLOAT8E4M3FN: [1.5, -3.0, 0.015625, 448.0, -0.0, 0.001953125, 2.0, 96.0],
    TensorProto.FLOAT8E4M3FNUZ: [1.5, -3.0, 0.015625, 240.0, 0.0, 0.0009765625, 2.0, 96.0],
    TensorProto.FLOAT8E5M2: [1.5, -3.0, 0.015625, 57344.0, -0.0, 1.52587890625e-05, 2.0, 96.0],
    TensorProto.FLOAT8E5M2FNUZ: [1.5, -3.0, 0.015625, 57344.0, 0.0, 7.62939453125e-06, 2.0, 96.0],
    TensorProto.INT4: [-8, 7, 0, -1, 3, -5, 1, 6],
    TensorProto.UINT4: [15, 0, 7, 8, 1, 2, 3, 9],
    TensorProto.INT8: [-128, 127, 0, -1, 3, -5, 1, 6],
    TensorProto.UINT8: [255, 0, 7, 8, 1, 2, 3, 9],
    TensorProto.INT16: [-32768, 32767, 0, -1, 3, -5, 1, 6],
    TensorProto.UINT16: [65535, 0, 7, 8, 1, 2, 3, 9],
    TensorProto.INT32: [-(2**24), 2**24, 0, -1, 3, -5, 1, 6],
    TensorProto.INT64: [-(2**24), 2**24, 0, -1, 3, -5, 1, 6],
    TensorProto.DOUBLE: [1.5, -3.0, 0.1, 1e30, -0.0, 1e-30, 2.0, 100.0],
    TensorProto.BOOL: [True, False, True, True, False, False, True, False],
}


def _model(tensor: TensorProto) -> onnx.ModelProto:
    nodes = [helper.make_node("Cast", ["w"], ["wf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "wf"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])], initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _ids(code: int) -> str:
    return TensorProto.DataType.Name(code).lower()


@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "typed_field"])
@pytest.mark.parametrize("code", sorted(VALUES), ids=_ids)
def test_initializer_of_every_type_decodes_like_onnxruntime(tmp_path: Path, code: int, raw: bool) -> None:
    import onnxruntime as ort

    tensor = helper.make_tensor("w", code, [8], VALUES[code], raw=False)
    if raw:
        from onnx.numpy_helper import to_array

        if code == TensorProto.BFLOAT16:
            bits = np.asarray(tensor.int32_data, np.uint16)
            tensor = helper.make_tensor("w", code, [8], bits.tobytes(), raw=True)
        else:
            array = to_array(tensor)
            if code in (TensorProto.INT4, TensorProto.UINT4):
                packed = np.asarray(tensor.int32_data, np.uint8)
                tensor = helper.make_tensor("w", code, [8], packed.tobytes(), raw=True)
            else:
                tensor = helper.make_tensor("w", code, [8], array.tobytes(), raw=True)
        assert tensor.HasField("raw_data")
    path = tmp_path / "m.onnx"
    onnx.save(_model(tensor), path)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = qcc.run(qcc.load(path), {"x": x})["y"]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("code", [TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.COMPLEX128], ids=_ids)
def test_types_qcc_cannot_represent_are_refused_by_name(tmp_path: Path, code: int) -> None:
    values = [b"a"] * 8 if code == TensorProto.STRING else [1 + 2j] * 8
    if code == TensorProto.STRING:
        tensor = helper.make_tensor("w", code, [8], values)
    else:
        tensor = TensorProto(name="w", data_type=code, dims=[8])
        tensor.raw_data = np.asarray(values, np.complex64 if code == TensorProto.COMPLEX64 else np.complex128).tobytes()
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(tensor).SerializeToString())
    with pytest.raises(UnsupportedError, match=rf"initializer 'w'.*{_ids(code).replace('complex', 'complex')}"):
        qcc.load(path)


def test_bfloat16_raw_data_is_deterministic_and_right(tmp_path: Path) -> None:
    """The campaign's case: bf16 initializer -> Cast -> MatMul; onnxruntime gives [3, 4]."""
    import onnxruntime as ort

    bits = (np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w = helper.make_tensor("w", TensorProto.BFLOAT16, [3, 2], bits.tobytes(), raw=True)
    nodes = [helper.make_node("Cast", ["w"], ["wf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=[w])
    path = tmp_path / "bf16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.array([[1.0, 2.0, 2.0]], np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(expected, [[3.0, 4.0]])
    for _ in range(3):
        np.testing.assert_array_equal(qcc.run(qcc.load(path), {"x": x})["y"], expected)
