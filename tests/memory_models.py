"""ONNX graphs built with onnx.helper for the memory-planning tests and bench (random weights).

- `resnet23`: the seed 003 ResNet23 (CIFAR-10, 3x32x32): conv-BN-ReLU, seven residual units
  (1x1 -> 3x3 -> 1x1 bottlenecks, add, ReLU, 2x2 max pooling after units 2, 4, 6), 4x4 average
  pooling, affine to 10 classes.
- `mobilenet_v1` / `mobilenet_v2`: the ImageNet architectures (Howard et al. 2017, Sandler et
  al. 2018) with BN folded into the convolutions (conv + bias -> ReLU6), as exported for
  deployment; `width` scales the channels, `size` the input.
- `inception_stack`: GoogLeNet's inception modules 3a, 3b (28x28) and 4a (14x14) without the
  stem, so the branchy modules, not the stem, set the peak (where the execution order matters).
"""

from __future__ import annotations

from typing import Any

import numpy as np

V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
             (6, 320, 1, 1))
V1_LAYERS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
             (512, 1), (512, 1), (1024, 2), (1024, 1))


class _Builder:
    """Appends ONNX nodes and seeded random initializers; names follow the layer scopes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def param(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        from onnx import numpy_helper

        if scale is None:
            scale = 1.4 / np.sqrt(max(1, int(np.prod(shape[1:]))))
        data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(data, name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int, name: str, stride: int = 1, group: int = 1,
             bias: bool = True) -> str:
        w = self.param(f"{name}/W", (cout, cin // group, k, k))
        ins = [x, w] + ([self.param(f"{name}/b", (cout,), 0.1)] if bias else [])
        return self.node("Conv", ins, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[k // 2] * 4, group=group)

    def bn(self, x: str, c: int, name: str) -> str:
        gamma = self.param(f"{name}/gamma", (c,), 0.1)
        beta = self.param(f"{name}/beta", (c,), 0.1)
        mean = self.param(f"{name}/mean", (c,), 0.1)
        var = f"{name}/var"
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(self.rng.uniform(0.5, 1.5, c).astype(np.float32), var))
        return self.node("BatchNormalization", [x, gamma, beta, mean, var], name)

    def relu6(self, x: str, name: str) -> str:
        from onnx import numpy_helper

        if not any(t.name == "relu6/min" for t in self.inits):
            self.inits.append(numpy_helper.from_array(np.array(0, np.float32), "relu6/min"))
            self.inits.append(numpy_helper.from_array(np.array(6, np.float32), "relu6/max"))
        return self.node("Clip", [x, "relu6/min", "relu6/max"], name)

    def classifier(self, x: str, c: int, classes: int) -> str:
        h = self.node("GlobalAveragePool", [x], "pool")
        h = self.node("Flatten", [h], "flatten")
        return self.node("Gemm", [h, self.param("fc/W", (classes, c)), self.param("fc/b", (classes,), 0.1)],
                         "logits", transB=1)

    def model(self, name: str, size: int, out: str, classes: int, channels: int = 3) -> bytes:
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, classes])],
            self.inits,
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        proto.ir_version = 8
        return bytes(proto.SerializeToString())


def resnet23(seed: int = 0, nmaps: int = 64, classes: int = 10) -> bytes:
    b = _Builder(seed)
    h = b.node("Relu", [b.bn(b.conv("x", 3, nmaps, 3, "conv1/conv", bias=False), nmaps, "conv1/bn")], "conv1/relu")
    for unit, down in (("conv2", False), ("conv3", True), ("conv4", False), ("conv5", True), ("conv6", False),
                       ("conv7", True), ("conv8", False)):
        x = h
        for part, (cout, k) in (("conv1", (nmaps // 2, 1)), ("conv2", (nmaps // 2, 3)), ("conv3", (nmaps, 1))):
            cin = nmaps if part == "conv1" else nmaps // 2
            h = b.bn(b.conv(h, cin, cout, k, f"{unit}/{part}/conv", bias=False), cout, f"{unit}/{part}/bn")
            if part != "conv3":
                h = b.node("Relu", [h], f"{unit}/{part}/relu")
        h = b.node("Relu", [b.node("Add", [h, x], f"{unit}/add")], f"{unit}/relu")
        if down:
            h = b.node("MaxPool", [h], f"{unit}/pool", kernel_shape=[2, 2], strides=[2, 2])
    h = b.node("AveragePool", [h], "pool", kernel_shape=[4, 4], strides=[4, 4])
    h = b.node("Flatten", [h], "flatten")
    b.node("Gemm", [h, b.param("affine/W", (classes, nmaps)), b.param("affine/b", (classes,), 0.1)], "y",
           transB=1)
    return b.model("resnet23", 32, "y", classes)


def _ch(c: float, width: float) -> int:
    return max(8, int(c * width + 4) // 8 * 8)


def mobilenet_v1(seed: int = 0, size: int = 224, width: float = 1.0, classes: int = 1000) -> bytes:
    b = _Builder(seed)
    c = _ch(32, width)
    h = b.relu6(b.conv("x", 3, c, 3, "conv0", stride=2), "conv0/relu6")
    for i, (cout, stride) in enumerate(V1_LAYERS, start=1):
        h = b.relu6(b.conv(h, c, c, 3, f"dw{i}", stride=stride, group=c), f"dw{i}/relu6")
        cout = _ch(cout, width)
        h = b.relu6(b.conv(h, c, cout, 1, f"pw{i}"), f"pw{i}/relu6")
        c = cout
    b.classifier(h, c, classes)
    return b.model("mobilenet_v1", size, "logits", classes)


def mobilenet_v2(seed: int = 0, size: int = 224, width: float = 1.0, classes: int = 1000) -> bytes:
    b = _Builder(seed)
    c = _ch(32, width)
    h = b.relu6(b.conv("x", 3, c, 3, "conv0", stride=2), "conv0/relu6")
    index = 0
    for t, cout, n, s in V2_BLOCKS:
        cout = _ch(cout, width)
        for j in range(n):
            index += 1
            name = f"block{index}"
            x = h
            hidden = c * t
            if t != 1:
                h = b.relu6(b.conv(h, c, hidden, 1, f"{name}/expand"), f"{name}/expand/relu6")
            h = b.relu6(b.conv(h, hidden, hidden, 3, f"{name}/dw", stride=s if j == 0 else 1, group=hidden),
                        f"{name}/dw/relu6")
            h = b.conv(h, hidden, cout, 1, f"{name}/project")
            if j > 0 or (s == 1 and c == cout):
                h = b.node("Add", [h, x], f"{name}/add")
            c = cout
    last = _ch(1280, max(1.0, width))
    h = b.relu6(b.conv(h, c, last, 1, "conv_last"), "conv_last/relu6")
    b.classifier(h, last, classes)
    return b.model("mobilenet_v2", size, "logits", classes)


INCEPTION = (("3a", 192, (64, 96, 128, 16, 32, 32)), ("3b", 256, (128, 128, 192, 32, 96, 64)),
             ("4a", 480, (192, 96, 208, 16, 48, 64)))


def inception_stack(seed: int = 0, size: int = 28, classes: int = 10) -> bytes:
    b = _Builder(seed)
    h = "x"
    for name, cin, (c1, r3, c3, r5, c5, cp) in INCEPTION:
        if name == "4a":
            h = b.node("MaxPool", [h], "pool3", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        branches = [b.node("Relu", [b.conv(h, cin, c1, 1, f"{name}/1x1")], f"{name}/1x1/relu")]
        for tag, red, out, k in (("3x3", r3, c3, 3), ("5x5", r5, c5, 5)):
            t = b.node("Relu", [b.conv(h, cin, red, 1, f"{name}/{tag}_reduce")], f"{name}/{tag}_reduce/relu")
            branches.append(b.node("Relu", [b.conv(t, red, out, k, f"{name}/{tag}")], f"{name}/{tag}/relu"))
        t = b.node("MaxPool", [h], f"{name}/pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
        branches.append(b.node("Relu", [b.conv(t, cin, cp, 1, f"{name}/pool_proj")], f"{name}/pool_proj/relu"))
        h = b.node("Concat", branches, f"{name}/concat", axis=1)
    b.classifier(h, 512, classes)
    return b.model("inception_stack", size, "logits", classes, channels=192)


def load(data: bytes, name: str) -> Any:
    """The IR model of built ONNX bytes."""
    import onnx

    from qcc.frontends.onnx import import_proto

    return import_proto(onnx.load_from_string(data), name)
