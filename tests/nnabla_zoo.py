"""NNabla test models built in-process (nothing downloaded) and helpers to run .nnp files.

MobileNet v1 comes from the nnabla_quantize_layers example; ResNet23 is seed 003's network;
`save_digits_mlp` trains a small Affine model on scikit-learn's bundled digits; `save_ops_zoo`
puts most functions the frontend maps into one network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "nnabla_quantize_layers"


def mobilenet_module() -> Any:
    spec = importlib.util.spec_from_file_location("qcc_example_mobilenet_v1", EXAMPLE / "mobilenet_v1.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _save(path: Path, x: Any, y: Any, net: str = "net", extra: list[dict[str, Any]] | None = None) -> None:
    from nnabla.utils.save import save

    networks = [{"name": net, "batch_size": x.shape[0], "outputs": {"y": y}, "names": {"x": x}}]
    executors = [{"name": "runtime", "network": net, "data": ["x"], "output": ["y"]}]
    save(str(path), {"networks": networks + (extra or []), "executors": executors})


def resnet23_prediction(image: Any, test: bool = False, ncls: int = 10, nmaps: int = 64, act: Any = None) -> Any:
    """Seed 003's ResNet23 (copied as the tutorial gives it)."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    act = act or F.relu

    def res_unit(x: Any, scope_name: str, dn: bool = False) -> Any:
        C = x.shape[1]
        with nn.parameter_scope(scope_name):
            with nn.parameter_scope("conv1"):
                h = PF.convolution(x, C // 2, kernel=(1, 1), pad=(0, 0), with_bias=False)
                h = PF.batch_normalization(h, batch_stat=not test)
                h = act(h)
            with nn.parameter_scope("conv2"):
                h = PF.convolution(h, C // 2, kernel=(3, 3), pad=(1, 1), with_bias=False)
                h = PF.batch_normalization(h, batch_stat=not test)
                h = act(h)
            with nn.parameter_scope("conv3"):
                h = PF.convolution(h, C, kernel=(1, 1), pad=(0, 0), with_bias=False)
                h = PF.batch_normalization(h, batch_stat=not test)
            h = act(F.add2(h, x, inplace=True))
            if dn:
                h = F.max_pooling(h, kernel=(2, 2), stride=(2, 2))
        return h

    with nn.parameter_scope("conv1"):
        if not test:
            image = F.image_augmentation(image, contrast=1.0, angle=0.25, flip_lr=True)
            image.need_grad = False
        h = PF.convolution(image, nmaps, kernel=(3, 3), pad=(1, 1), with_bias=False)
        h = PF.batch_normalization(h, batch_stat=not test)
        h = act(h)
    h = res_unit(h, "conv2", False)
    h = res_unit(h, "conv3", True)
    h = res_unit(h, "conv4", False)
    h = res_unit(h, "conv5", True)
    h = res_unit(h, "conv6", False)
    h = res_unit(h, "conv7", True)
    h = res_unit(h, "conv8", False)
    h = F.average_pooling(h, kernel=(4, 4))
    pred = PF.affine(h, ncls)
    return pred


def save_resnet23(path: Path, seed: int = 1) -> None:
    import nnabla as nn

    nn.clear_parameters()
    x = nn.Variable((1, 3, 32, 32))
    y = resnet23_prediction(x, test=True)
    mobilenet_module().randomize_parameters(seed)
    _save(path, x, y)


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def save_digits_mlp(path: Path, iterations: int = 300, seed: int = 0) -> float:
    """Train x(N,64) -> Affine(32) -> ReLU -> Affine(10) briefly; returns training accuracy."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S

    nn.clear_parameters()
    nn.seed(seed)
    data, labels = digits_data()
    rng = np.random.RandomState(seed)

    def net(x: Any) -> Any:
        with nn.parameter_scope("fc1"):
            h = F.relu(PF.affine(x, 32, rng=rng))
        with nn.parameter_scope("fc2"):
            return PF.affine(h, 10, rng=rng)

    xb, tb = nn.Variable((64, 64)), nn.Variable((64, 1))
    loss = F.mean(F.softmax_cross_entropy(net(xb), tb))
    solver = S.Adam(0.01)
    solver.set_parameters(nn.get_parameters())
    for _ in range(iterations):
        idx = rng.randint(0, len(data), 64)
        xb.d, tb.d = data[idx], labels[idx, None]
        solver.zero_grad()
        loss.forward()
        loss.backward()
        solver.update()
    x = nn.Variable((1, 64))
    y = net(x)
    _save(path, x, y, "digits")
    full = nn.Variable((len(data), 64))
    out = net(full)
    full.d = data
    out.forward()
    return float((out.d.argmax(1) == labels).mean())


def save_ops_zoo(path: Path, seed: int = 3, quantize: bool = True) -> None:
    """Most mapped functions, each branch reduced to a vector, concatenated into one output.

    quantize=False leaves out the quantize functions (qcc's float ONNX export drops them).
    """
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    nn.clear_parameters()
    rng = np.random.RandomState(seed)
    x = nn.Variable((1, 4, 9, 9))
    a = F.leaky_relu(PF.convolution(x, 6, (3, 3), pad=(1, 1), group=2, name="gconv", rng=rng), 0.2)
    b = F.elu(PF.depthwise_convolution(a, (3, 3), pad=(1, 1), multiplier=2, name="dw", rng=rng))
    c = F.relu6(PF.deconvolution(b, 4, (3, 3), stride=(2, 2), pad=(1, 1), name="deconv", rng=rng))
    branches = [
        F.max_pooling(c, (3, 3), (2, 2), pad=(1, 1)),
        F.sum_pooling(c, (2, 2), (2, 2), ignore_border=False),
        F.average_pooling(c, (3, 3), (2, 2), ignore_border=False, including_pad=False),
        F.average_pooling(c, (3, 3), (2, 2), pad=(1, 1), including_pad=True),
        F.swish(PF.binary_connect_convolution(b, 4, (3, 3), pad=(1, 1), name="bcconv", rng=rng)),
        F.tanh(PF.binary_weight_convolution(b, 4, (1, 1), name="bwconv", rng=rng)),
    ]
    if quantize:
        branches += [F.fixed_point_quantize(F.tanh(a), sign=True, n=8, delta=2.0 ** -5),
                     PF.min_max_quantize(a, ql_min=0, ql_max=255, x_min_max=False, ema=False, name="mmq")]
    vectors = [F.reshape(F.global_average_pooling(h), (1, h.shape[1])) for h in branches[:3]]
    vectors += [F.mean(h, axis=(2, 3)) for h in branches[3:6]]
    vectors += [F.max(h, axis=(2, 3)) for h in branches[6:]]
    v = F.concatenate(*vectors, axis=1)
    v = PF.batch_normalization(F.identity(v), batch_stat=False, name="bn1d")
    h = F.sigmoid(PF.affine(v, 12, name="fc1", rng=rng))
    h = F.add_scalar(F.mul_scalar(h, 2.0), -0.5)
    h = F.r_sub_scalar(F.pow_scalar(h, 2.0), 1.0)
    h = F.r_div_scalar(F.add_scalar(F.exp(F.minimum_scalar(F.maximum_scalar(h, -2.0), 2.0)), 1.0), 3.0)
    parts = F.split(F.reshape(h, (1, 3, 4)), axis=1)
    h = F.stack(F.add2(parts[0], parts[1]), F.mul2(parts[1], parts[2]), F.div2(parts[2], F.add_scalar(parts[0], 2.0)),
                axis=1)
    h = F.transpose(F.concatenate(h, F.sub2(F.maximum2(parts[0], parts[2]), F.minimum2(parts[1], parts[0])).reshape(
        (1, 1, 4)), axis=1), (0, 2, 1))
    h = F.slice(F.pad(h, (1, 1, 0, 2), "constant", 0.5), (0, 0, 1), (1, 6, 6), (1, 2, 1))
    h = F.hard_sigmoid(F.hard_tanh(F.gelu(PF.affine(h, 8, name="fc2", rng=rng))))
    h = F.sum(F.reshape(h, (1, 2, 4)), axis=1) + F.log(F.abs(h.reshape((1, 8))[:, :4]) + 1.0)
    y = F.softmax(PF.binary_weight_affine(h, 5, name="bwfc", rng=rng) +
                  PF.binary_connect_affine(h, 5, name="bcfc", rng=rng))
    mobilenet_module().randomize_parameters(seed)
    _save(path, x, y, "zoo")


def nnabla_run(path: Path | str, feed: np.ndarray, network: str | None = None) -> tuple[np.ndarray, list[str]]:
    """Output and function sequence (y.visit order, like seed 000 prints it) of an .nnp in nnabla."""
    import nnabla as nn
    from nnabla.utils.nnp_graph import NnpLoader

    nn.clear_parameters()
    nnp = NnpLoader(str(path))
    net = nnp.get_network(network or nnp.get_network_names()[0], batch_size=feed.shape[0])
    (x,) = net.inputs.values()
    (y,) = net.outputs.values()
    x.d = feed
    y.forward(clear_buffer=True)
    names: list[str] = []
    y.visit(lambda f: names.append(f.info.type_name))
    return np.array(y.d, copy=True), names
