"""Models on which post-training quantization is known to break, built in seconds, nothing downloaded.

- `mobilenet_digits`: a MobileNetV2-style network (inverted residual blocks: 1x1 expansion,
  3x3 depthwise, 1x1 projection, BatchNorm and ReLU6 everywhere) trained on scikit-learn's
  digits. Two expansion channels per block are dead, as weight decay and ReLU6 leave some in
  real MobileNetV2 training: their depthwise BatchNorm sees a constant and ends with a running
  variance near zero, so folding it scales that depthwise filter hundreds of times above the
  others (docs/quantization.md, "the known MobileNetV2 failure").
- `heavy_tailed_digits`: the bundled digits CNN with a few rare, large activation channels
  (the channels that fire least often, scaled up 16x, the next layer scaled down to match:
  the same function, heavy-tailed tensors).

Both are deterministic (seeded, single-threaded training; exact rescaling) and come as ONNX
files (qcc's own float ONNX backend writes the trained module), so qcc and onnxruntime's
quantize_static read the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np

from qcc.ir.core import Model

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


@attrs.frozen
class NetFiles:
    """A float model as a user has it: an ONNX file, calibration and labelled test data."""

    model: Path
    calib: Path
    test: Path
    x: np.ndarray
    labels: np.ndarray


@attrs.frozen
class Task:
    """A trained float model with its data splits (x: (N, 1, 8, 8) float32)."""

    module: Any
    calib: np.ndarray
    test: np.ndarray
    labels: np.ndarray
    calib_labels: np.ndarray

    def model(self) -> Model:
        import torch

        from qcc.driver import load

        batch = torch.export.Dim("N", min=1, max=1 << 16)
        program = torch.export.export(self.module.eval(), (torch.from_numpy(self.calib[:2]),),
                                      dynamic_shapes=({0: batch},))
        return load(program, input_names=["x"])

    def write_onnx(self, path: Path) -> Path:
        from qcc.api import write

        write(self.model(), path, target="onnx")
        return path

    def save(self, folder: Path, name: str) -> NetFiles:
        """The model as ONNX (BatchNorm unfolded, as torch has it) and its data as .npz files."""
        model = self.write_onnx(folder / f"{name}.onnx")
        np.savez(folder / "calib.npz", x=self.calib)
        np.savez(folder / "test.npz", x=self.test, labels=self.labels)
        return NetFiles(model, folder / "calib.npz", folder / "test.npz", self.test, self.labels)


def digits_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The example's split: 60/20/20 train/calib/test, x = image / 16."""
    from examples.digits.train import load_splits

    return load_splits(seed)


def _mobilenet_module(dead_per_block: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
            super().__init__()
            mid = cin * expand
            self.expand = nn.Conv2d(cin, mid, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(mid)
            self.dw = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, groups=mid, bias=False)
            nn.init.normal_(self.dw.weight, std=1.0)  # BatchNorm makes the scale moot, except where dead
            self.bn2 = nn.BatchNorm2d(mid)
            self.project = nn.Conv2d(mid, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.residual = stride == 1 and cin == cout
            self.dead = list(range(dead_per_block))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = nn.functional.relu6(self.bn1(self.expand(x)))
            h = nn.functional.relu6(self.bn2(self.dw(h)))
            h = self.bn3(self.project(h))
            return h + x if self.residual else h

    class MobileNetDigits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(16)
            self.blocks = nn.Sequential(Block(16, 16, 4, 1), Block(16, 24, 4, 2), Block(24, 24, 4, 1))
            self.head = nn.Conv2d(24, 64, 1, bias=False)
            self.bn_head = nn.BatchNorm2d(64)
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = nn.functional.relu6(self.bn(self.stem(x)))
            h = self.blocks(h)
            h = nn.functional.relu6(self.bn_head(self.head(h)))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))

    return MobileNetDigits()


def _kill_channels(module: Any) -> None:
    """Dead expansion channels: zero filter and a negative BatchNorm shift, kept by the optimizer."""
    import torch

    with torch.no_grad():
        for block in module.blocks:
            for c in block.dead:
                block.expand.weight[c].zero_()
                block.bn1.bias[c] = -1.0
                block.bn1.weight[c] = 1.0


def _train(module: Any, x: np.ndarray, y: np.ndarray, epochs: int, seed: int, lr: float,
           after_step: Any = None, batch: int = 32) -> None:
    import torch
    from torch.nn import functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    module.train()
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            opt.zero_grad()
            loss = F.cross_entropy(module(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step(module)
        sched.step()
    module.eval()


def mobilenet_digits(seed: int = 0, epochs: int = 5, dead_per_block: int = 2, batch: int = 64) -> Task:
    """The MobileNetV2-style digits network, trained (a few seconds on 2 cores)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    splits = digits_splits()
    module = _mobilenet_module(dead_per_block)
    _kill_channels(module)
    x, y = splits["train"]
    _train(module, x, y, epochs, seed, 1e-2, _kill_channels, batch)
    return Task(module, splits["calib"][0], splits["test"][0], splits["test"][1], splits["calib"][1])


HEAVY_LAYERS = (("bn2", "conv3", 16), ("bn5", "fc", 32))
"""(BatchNorm whose channels grow, the layer that reads them, channels): relu2 and relu5."""


def heavy_tailed_digits(out: Path, factor: float = 16.0, channels: int = 2) -> Path:
    """The bundled digits CNN with a few rare, large activation channels; the same function.

    In relu2 and relu5 the `channels` channels that fire least often on the calibration data are
    multiplied by `factor` (their BatchNorm's gamma and beta) and the layer that reads them divides
    its weights on them by it: the float model computes the same logits (to float32 rounding),
    but each of those tensors now has rare values `factor` times larger than the bulk, the
    heavy tail that makes minmax ranges waste most of the grid.
    """
    import onnx
    from onnx import numpy_helper

    from qcc.driver import load
    from qcc.sim import run_model

    proto = onnx.load(str(DIGITS / "digits_cnn.onnx"))
    inits = {t.name: t for t in proto.graph.initializer}
    calib = np.load(DIGITS / "calib.npz")["x"]
    acts = run_model(load(str(DIGITS / "digits_cnn.onnx")), {"x": calib}, keep_all=True)

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name]).copy()

    def store(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    for bn, reader, count in HEAVY_LAYERS:
        relu = acts["relu" + bn[2:]]
        firing = (relu > 0).mean(axis=tuple(a for a in range(relu.ndim) if a != 1))
        order = [int(c) for c in np.argsort(firing, kind="stable") if firing[c] > 0][:channels]
        assert len(order) == channels and relu.shape[1] == count
        gamma, beta = array(f"{bn}.weight"), array(f"{bn}.bias")
        gamma[order] *= factor
        beta[order] *= factor
        store(f"{bn}.weight", gamma)
        store(f"{bn}.bias", beta)
        w = array(f"{reader}.weight")
        if reader == "fc":  # Gemm transB: (10, 32*2*2), input index c*4 + position
            cols = [c * 4 + p for c in order for p in range(4)]
            w[:, cols] /= factor
        else:
            w[:, order] /= factor
        store(f"{reader}.weight", w)
    onnx.save(proto, str(out))
    return out
