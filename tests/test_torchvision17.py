"""torchvision models with random weights through torch.export (issue 17): MobileNetV3 (hardswish,
hardsigmoid, squeeze-excitation), EfficientNet (its MBConv blocks with SiLU), LR-ASPP segmentation (bilinear
interpolate) and a small ViT (patch embedding, class token, multi-head attention, LayerNorm,
GELU) match torch and, written as ONNX by qcc, onnxruntime, in float. Small inputs keep it fast;
bench/bench_torchvision17.py runs the full sizes and quantizes the ViT to int8 (C and QDQ); the
int8 attention block of tests/test_op_matmul.py is the suite's transformer check."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import qcc
from qcc.formats.onnx_export import to_onnx
from tests.onnx_zoo import ort_run

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


def randomized(make: Any) -> Any:
    """`make()` with seeded random weights everywhere (torchvision zero-initializes some heads), in
    eval mode: the same weights whatever ran before."""
    torch.manual_seed(0)
    net = make()
    with torch.no_grad():
        for p in net.parameters():
            if not p.abs().sum():
                p.normal_(0, 0.05)
    return net.eval()


def small_efficientnet() -> Any:
    """EfficientNet-B0's blocks (MBConv: SiLU, squeeze-excitation) at half width and a third of the depth."""
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    settings, _ = _efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.34)
    return randomized(lambda: EfficientNet(settings, dropout=0.2, num_classes=10))


def small_vit() -> Any:
    return randomized(lambda: torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                                   num_heads=2, hidden_dim=32, mlp_dim=64,
                                                                   num_classes=10))


MODELS = {
    "mobilenet_v3_small": (lambda: randomized(lambda: torchvision.models.mobilenet_v3_small(num_classes=10)), 64),
    "efficientnet": (small_efficientnet, 64),
    "lraspp_mobilenet_v3_large": (lambda: randomized(lambda: torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights_backbone=None, num_classes=4)), 64),
    "vit": (small_vit, 32),
}


def torch_output(net: Any, x: Any) -> np.ndarray:
    with torch.no_grad():
        y = net(x)
    return (y["out"] if isinstance(y, dict) else y).numpy()


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_torch_and_onnxruntime(name: str) -> None:
    make, size = MODELS[name]
    net = make()
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    want = torch_output(net, x)
    model = qcc.load(net, example_inputs=x)
    feeds = {model.graph.inputs[0].name: x.numpy()}
    scale = float(np.max(np.abs(want)))
    got = qcc.run(model, feeds)[model.graph.outputs[0].name]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    (ort,) = ort_run(to_onnx(model).SerializeToString(), feeds)[:1]
    np.testing.assert_allclose(ort, want, rtol=0, atol=1e-5 * scale)
    ops = {n.op for n in model.graph.nodes}
    assert {"mobilenet_v3_small": {"HardSwish", "HardSigmoid"}, "efficientnet": {"Silu", "Sigmoid"},
            "lraspp_mobilenet_v3_large": {"Resize", "HardSwish"}, "vit": {"LayerNorm", "Gelu", "MatMul", "Softmax"}}[name] <= ops
