"""MobileNet v1 (224x224, 1000 classes) built with nnabla's PF API, with seeded random weights.

nnabla's model zoo (`nnabla.models.imagenet.MobileNet`) downloads its weights, which this
example cannot; the architecture is the same (3x3 stem, 13 depthwise-separable blocks,
7x7 average pooling, Affine, Softmax), preceded by the zoo's ImageAugmentation / MulScalar /
AddScalar input normalization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
          (512, 1), (512, 1), (1024, 2), (1024, 1)]


def mobilenet_v1(x: Any, num_classes: int = 1000) -> Any:
    """The inference graph (BatchNormalization with batch_stat=False) from image x to y' (softmax)."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    def conv_bn_relu(h: Any, scope: str, maps: int, kernel: int, stride: int, depthwise: bool = False) -> Any:
        pad = (kernel // 2, kernel // 2)
        with nn.parameter_scope(scope):
            if depthwise:
                h = PF.depthwise_convolution(h, (kernel, kernel), pad=pad, stride=(stride, stride), with_bias=False)
            else:
                h = PF.convolution(h, maps, (kernel, kernel), pad=pad, stride=(stride, stride), with_bias=False)
            h = PF.batch_normalization(h, batch_stat=False)
        return F.relu(h)

    h = F.image_augmentation(x)
    h = F.mul_scalar(h, 0.01735)
    h = F.add_scalar(h, -1.99)
    h = conv_bn_relu(h, "conv1", 32, 3, 2)
    for i, (maps, stride) in enumerate(BLOCKS, start=2):
        h = conv_bn_relu(h, f"conv{i}/dw", maps, 3, stride, depthwise=True)
        h = conv_bn_relu(h, f"conv{i}/pw", maps, 1, 1)
    h = F.average_pooling(h, (7, 7))
    with nn.parameter_scope("fc"):
        h = PF.affine(h, num_classes)
    return F.softmax(h)


def randomize_parameters(seed: int) -> None:
    """He-normal weights and plausible BatchNormalization statistics for every current parameter."""
    import nnabla as nn

    rng = np.random.RandomState(seed)
    for name, param in nn.get_parameters(grad_only=False).items():
        shape = param.shape
        leaf = name.rsplit("/", 1)[-1]
        if leaf == "W":
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else int(shape[0])
            param.d = rng.randn(*shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif leaf in ("gamma", "var"):
            param.d = rng.uniform(0.5, 1.5, shape)
        elif leaf in ("b", "beta", "mean"):
            param.d = rng.randn(*shape) * 0.1


def save_mobilenet_v1(path: str | Path, seed: int = 0, size: int = 224) -> None:
    """Build, randomize and save as an .nnp with network 'Runtime' and executor 'runtime'."""
    import nnabla as nn
    from nnabla.utils.save import save

    nn.clear_parameters()
    x = nn.Variable((1, 3, size, size))
    y = mobilenet_v1(x)
    randomize_parameters(seed)
    save(str(path), {
        "networks": [{"name": "Runtime", "batch_size": 1, "outputs": {"y'": y}, "names": {"x": x}}],
        "executors": [{"name": "runtime", "network": "Runtime", "data": ["x"], "output": ["y'"]}],
    })
