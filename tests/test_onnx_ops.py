"""ONNX op coverage across opsets: each small graph runs in ORT, in qcc's interpreter, and in ORT
again after qcc's ONNX export; all three must agree."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from qcc.formats.onnx_export import to_onnx
from qcc.frontends.onnx import import_proto
from qcc.sim import run_model
from tests.onnx_zoo import ort_run


def _model(nodes: list[Any], inputs: dict[str, list[int]], output: str, opset: int,
           inits: dict[str, np.ndarray] | None = None) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


rng = np.random.default_rng(0)
W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
WT = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)


def cases() -> list[tuple[str, Any]]:
    from onnx import helper

    h = helper.make_node
    x = {"x": [2, 3, 9, 9]}
    return [
        ("clip-opset9", _model([h("Clip", ["x"], ["y"], min=-0.5, max=0.7)], x, "y", 9)),
        ("clip-opset13", _model([h("Clip", ["x", "lo", "hi"], ["y"])], x, "y", 13,
                                {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)})),
        ("pad-opset9", _model([h("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], value=0.5)], x, "y", 9)),
        ("pad-reflect-opset13", _model([h("Pad", ["x", "p"], ["y"], mode="reflect")], x, "y", 13,
                                       {"p": _i64(0, 0, 1, 2, 0, 0, 2, 1)})),
        ("squeeze-unsqueeze-attr", _model([h("Unsqueeze", ["x"], ["u"], axes=[0]), h("Squeeze", ["u"], ["y"], axes=[0])],
                                          x, "y", 11)),
        ("squeeze-unsqueeze-input", _model([h("Unsqueeze", ["x", "a"], ["u"]), h("Squeeze", ["u", "a"], ["y"])],
                                           x, "y", 13, {"a": _i64(0)})),
        ("split-attr", _model([h("Split", ["x"], ["a", "b"], axis=1, split=[1, 2]), h("Mul", ["a", "b"], ["y"])],
                              x, "y", 11)),
        ("split-input", _model([h("Split", ["x", "s"], ["a", "b"], axis=2), h("Concat", ["b", "a"], ["y"], axis=2)],
                               x, "y", 13, {"s": _i64(4, 5)})),
        ("softmax-opset11-axis1", _model([h("Softmax", ["x"], ["y"], axis=1)], x, "y", 11)),
        ("softmax-opset13", _model([h("Softmax", ["x"], ["y"], axis=1)], x, "y", 13)),
        ("shape-folding-reshape", _model([
            h("Shape", ["x"], ["s"]), h("Gather", ["s", "i0"], ["n"], axis=0), h("Unsqueeze", ["n", "a0"], ["n1"]),
            h("Concat", ["n1", "m1"], ["shape"], axis=0), h("Reshape", ["x", "shape"], ["y"])],
            x, "y", 13, {"i0": np.array(0, np.int64), "a0": _i64(0), "m1": _i64(-1)})),
        ("conv-same-upper", _model([h("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])], x, "y", 11,
                                   {"w": W})),
        ("conv-transpose", _model([h("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                     output_padding=[1, 1])], x, "y", 13, {"w": WT})),
        ("avgpool-ceil-include-pad", _model([h("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)], x, "y", 13)),
        ("maxpool-ceil", _model([h("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
                                x, "y", 12)),
        ("reducemean-opset18", _model([h("ReduceMean", ["x", "ax"], ["y"], keepdims=0)], x, "y", 18,
                                      {"ax": _i64(2, 3)})),
        ("gemm-transb-alpha-beta", _model([h("Flatten", ["x"], ["f"]), h("Gemm", ["f", "w", "c"], ["y"], transB=1,
                                                                        alpha=0.5, beta=2.0)], x, "y", 13,
                                          {"w": rng.standard_normal((5, 243)).astype(np.float32),
                                           "c": rng.standard_normal(5).astype(np.float32)})),
        ("activations-opset14", _model([h("HardSwish", ["x"], ["a"]), h("LeakyRelu", ["a"], ["b"], alpha=0.2),
                                        h("HardSigmoid", ["b"], ["c"]), h("Elu", ["c"], ["d"]), h("Tanh", ["d"], ["y"])],
                                       x, "y", 14)),
        ("lrn-sum-max", _model([h("LRN", ["x"], ["l"], size=3), h("Sum", ["x", "l", "x"], ["s"]),
                                h("Max", ["s", "x"], ["y"])], x, "y", 13)),
        ("slice-transpose", _model([h("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
                                    h("Transpose", ["s"], ["y"], perm=[0, 2, 3, 1])], x, "y", 13,
                                   {"st": _i64(1, 0), "en": _i64(9, 100), "ax": _i64(2, 3), "sp": _i64(2, 3)})),
        ("matmul-dense-and-batched", _model([h("Reshape", ["x", "r"], ["m"]), h("MatMul", ["m", "w"], ["d"]),
                                             h("MatMul", ["d", "v"], ["y"])], x, "y", 13,
                                            {"r": _i64(2, 243), "w": rng.standard_normal((243, 7)).astype(np.float32),
                                             "v": rng.standard_normal((7, 3)).astype(np.float32)})),
        ("global-pools-dropout", _model([h("GlobalAveragePool", ["x"], ["a"]), h("GlobalMaxPool", ["x"], ["b"]),
                                         h("Sub", ["a", "b"], ["c"]), h("Dropout", ["c"], ["y"])], x, "y", 13)),
    ]


CASES = cases()


@pytest.mark.parametrize("name,proto", CASES, ids=[c[0] for c in CASES])
def test_op_agrees_with_onnxruntime(name: str, proto: Any) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 9)).astype(np.float32)
    (ref,) = ort_run(proto.SerializeToString(), {"x": x})
    model = import_proto(proto, name)
    (ours,) = run_model(model, {"x": x}).values()
    scale = max(float(np.abs(ref).max()), 1e-6)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * scale
    (back,) = ort_run(to_onnx(model).SerializeToString(), {"x": x})
    assert np.abs(back - ref).max() <= 1e-4 * scale
    # shape subgraphs fold away: no Shape/Gather nodes survive in the IR
    assert not {n.op for n in model.graph.nodes} & {"Shape", "Gather", "Concat"} or name != "shape-folding-reshape"


def test_opset_out_of_range_is_unsupported() -> None:
    from onnx import helper

    from qcc.errors import UnsupportedError

    proto = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2]}, "y", 8)
    with pytest.raises(UnsupportedError, match="opset 8 is not supported"):
        import_proto(proto, "old.onnx")
