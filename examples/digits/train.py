"""Train qcc's bundled example: a small CNN on scikit-learn's 8x8 digits, written as ONNX.

The graph is written node by node with onnx.helper (not torch.onnx.export) so that its names,
its un-folded BatchNormalization nodes and its opset are fixed by this file alone: the model
exists to give qcc's passes (fold-bn, quantize insertion, calibration) known work to do.

Run: ``python examples/digits/train.py`` (rewrites the committed files beside this script).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL_FILE = "digits_cnn.onnx"
CALIB_FILE = "calib.npz"
TEST_FILE = "test.npz"
OPSET = 13
IR_VERSION = 7  # the IR version that came with opset 13: readable by older tools too
DEFAULT_EPOCHS = 12
BATCH_SIZE = 32
MAX_ABS_DIFF = 1e-4


def load_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Stratified 60/20/20 train/calib/test split; x is (N,1,8,8) float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(
        x, y, test_size=0.4, stratify=y, random_state=seed
    )
    x_calib, x_test, y_calib, y_test = train_test_split(
        x_rest, y_rest, test_size=0.5, stratify=y_rest, random_state=seed
    )
    return {
        "train": (x_train, y_train),
        "calib": (x_calib, y_calib),
        "test": (x_test, y_test),
    }


def build_model() -> Any:
    """The torch module; built inside a function so importing this file does not need torch."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class DigitsCNN(nn.Module):
        """conv-bn-relu stem, residual block, two-branch concat, max pool, conv, avg pool, dense.

        conv1 keeps its bias and the other convolutions have none, so BN folding meets both.
        """

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=True)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(16)
            self.conv3 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn3 = nn.BatchNorm2d(16)
            self.conv4a = nn.Conv2d(16, 16, 1, bias=False)
            self.bn4a = nn.BatchNorm2d(16)
            self.conv4b = nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn4b = nn.BatchNorm2d(16)
            self.conv5 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
            self.bn5 = nn.BatchNorm2d(32)
            self.fc = nn.Linear(32 * 2 * 2, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h1 = F.relu(self.bn1(self.conv1(x)))
            h2 = F.relu(self.bn2(self.conv2(h1)))
            h3 = F.relu(self.bn3(self.conv3(h2)) + h1)
            a = F.relu(self.bn4a(self.conv4a(h3)))
            b = F.relu(self.bn4b(self.conv4b(h3)))
            h4 = F.max_pool2d(torch.cat([a, b], dim=1), 2)
            h5 = F.relu(self.bn5(self.conv5(h4)))
            h6 = F.avg_pool2d(h5, 2)
            return self.fc(torch.flatten(h6, 1))

    return DigitsCNN()


def to_onnx(model: Any) -> Any:
    """Write the trained module as an opset-13 ONNX graph with a symbolic batch 'N'."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    params = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str) -> str:
        inits.append(numpy_helper.from_array(params[name].astype(np.float32), name))
        return name

    def conv(name: str, x: str) -> str:
        module = getattr(model, name)
        k = module.kernel_size[0]
        p = module.padding[0]
        inputs = [x, init(f"{name}.weight")]
        if module.bias is not None:
            inputs.append(init(f"{name}.bias"))
        nodes.append(
            helper.make_node(
                "Conv",
                inputs,
                [name],
                name=name,
                kernel_shape=[k, k],
                pads=[p, p, p, p],
                strides=[1, 1],
                dilations=[1, 1],
                group=1,
            )
        )
        return name

    def bn(name: str, x: str) -> str:
        module = getattr(model, name)
        stats = ("weight", "bias", "running_mean", "running_var")
        inputs = [x] + [init(f"{name}.{s}") for s in stats]
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                inputs,
                [name],
                name=name,
                epsilon=float(module.eps),
                momentum=1.0 - float(module.momentum),
            )
        )
        return name

    def op(op_type: str, name: str, inputs: list[str], **attrs: Any) -> str:
        nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    h1 = op("Relu", "relu1", [bn("bn1", conv("conv1", "x"))])
    h2 = op("Relu", "relu2", [bn("bn2", conv("conv2", h1))])
    h3 = op("Relu", "relu3", [op("Add", "add1", [bn("bn3", conv("conv3", h2)), h1])])
    a = op("Relu", "relu4a", [bn("bn4a", conv("conv4a", h3))])
    b = op("Relu", "relu4b", [bn("bn4b", conv("conv4b", h3))])
    cat = op("Concat", "concat1", [a, b], axis=1)
    h4 = op("MaxPool", "maxpool1", [cat], kernel_shape=[2, 2], strides=[2, 2])
    h5 = op("Relu", "relu5", [bn("bn5", conv("conv5", h4))])
    h6 = op("AveragePool", "avgpool1", [h5], kernel_shape=[2, 2], strides=[2, 2])
    flat = op("Flatten", "flatten1", [h6], axis=1)
    nodes.append(
        helper.make_node(
            "Gemm",
            [flat, init("fc.weight"), init("fc.bias")],
            ["logits"],
            name="fc",
            alpha=1.0,
            beta=1.0,
            transB=1,
        )
    )
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="qcc-examples-digits",
        ir_version=IR_VERSION,
        doc_string="8x8 digits CNN (sklearn load_digits), input x/16, output logits",
    )
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def onnx_logits(model_path: Path, x: np.ndarray) -> np.ndarray:
    """Logits of the ONNX file under onnxruntime's CPU provider."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    out = sess.run(["logits"], {"x": x})[0]
    return np.asarray(out)


def _fit(model: Any, x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> None:
    import torch
    from torch.nn import functional as F

    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    steps_per_epoch = (len(x) + BATCH_SIZE - 1) // BATCH_SIZE
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=1e-2, epochs=epochs, steps_per_epoch=steps_per_epoch
    )
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            opt.zero_grad()
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
    model.eval()


def train(out_dir: Path, epochs: int = DEFAULT_EPOCHS, seed: int = 0) -> dict[str, Any]:
    """Train, write the ONNX model and the calib/test splits into out_dir, return the metrics.

    Raises RuntimeError if onnxruntime's logits differ from torch's by MAX_ABS_DIFF or more.
    """
    import onnx
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    splits = load_splits(seed)
    x_train, y_train = splits["train"]
    x_calib, _ = splits["calib"]
    x_test, y_test = splits["test"]

    model = build_model()
    start = time.perf_counter()
    _fit(model, x_train, y_train, epochs, seed)
    train_seconds = time.perf_counter() - start

    with torch.no_grad():
        torch_logits = model(torch.from_numpy(x_test)).numpy()
    model_path = out_dir / MODEL_FILE
    onnx.save(to_onnx(model), str(model_path))
    ort_logits = onnx_logits(model_path, x_test)
    max_abs_diff = float(np.max(np.abs(ort_logits - torch_logits)))
    if not max_abs_diff < MAX_ABS_DIFF:
        raise RuntimeError(
            f"{model_path}: onnxruntime logits differ from torch by {max_abs_diff:.3g} "
            f"(limit {MAX_ABS_DIFF})"
        )
    np.savez_compressed(out_dir / CALIB_FILE, x=x_calib)
    np.savez_compressed(out_dir / TEST_FILE, x=x_test, labels=y_test)
    return {
        "model": str(model_path),
        "epochs": epochs,
        "seed": seed,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "train_seconds": round(train_seconds, 2),
        "samples": {name: len(xy[0]) for name, xy in splits.items()},
        "torch_test_accuracy": float(np.mean(torch_logits.argmax(1) == y_test)),
        "onnx_test_accuracy": float(np.mean(ort_logits.argmax(1) == y_test)),
        "max_abs_diff": max_abs_diff,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(train(args.out_dir, args.epochs, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
