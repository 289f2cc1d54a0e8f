"""PyTorch frontend: models import with no preparation and match torch in qcc's interpreter and
in onnxruntime (through the ONNX backend); unsupported ops fail once, listing all of them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch: Any = pytest.importorskip("torch")
nn: Any = torch.nn
F: Any = torch.nn.functional

from qcc.errors import UnsupportedError  # noqa: E402
from qcc.formats.onnx_export import to_onnx  # noqa: E402
from qcc.frontends.torch import decomposition_table, load_exported, load_module  # noqa: E402
from qcc.ir.core import Model  # noqa: E402
from qcc.sim import run_model  # noqa: E402
from tests.cli_util import DIGITS, ROOT, one_error_line  # noqa: E402

QCC = Path(sys.executable).with_name("qcc")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")  # torch.export's notes


class BasicModule(nn.Module):
    """Distiller's "Preparing a Model for Quantization" example, unchanged (seed 004)."""

    def __init__(self, in_ch, out_ch, kernel_size):
        super(BasicModule, self).__init__()  # noqa: UP008  (kept as in the seed)
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size)
        self.bn2 = nn.BatchNorm2d(out_ch)

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)

        # (1) Overloaded tensor addition operation
        # Alternatively, could be called via a tensor function: skip_1.add_(identity)
        out += identity
        # (2) Relu module re-used
        out = self.relu(out)

        # (3) Using operation from 'torch' namespace
        out = torch.cat([identity, out], dim=1)
        # (4) Using function from torch.nn.functional
        out = F.sigmoid(out)

        return out


def _randomize_bn(module: Any) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_(1, 0.2)
                m.bias.normal_(0, 0.2)


def _torch_outputs(module: Any, inputs: tuple[Any, ...]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module.eval()(*inputs)
    flat: list[Any] = []

    def walk(item: Any) -> None:
        if isinstance(item, (tuple, list)):
            for sub in item:
                walk(sub)
        else:
            flat.append(item.numpy())

    walk(out)
    return flat


def _feeds(model: Model, inputs: tuple[Any, ...]) -> dict[str, np.ndarray]:
    return {v.name: t.numpy() for v, t in zip(model.graph.inputs, inputs)}


def _onnx_outputs(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def assert_matches(got: np.ndarray, ref: np.ndarray, what: str) -> float:
    """Max abs difference within 1e-4 of the output's max abs value; returns the relative diff."""
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != torch {ref.shape}"
    scale = float(np.abs(ref).max()) or 1.0
    diff = float(np.abs(got - ref).max())
    assert diff <= 1e-4 * scale, f"{what}: max diff {diff:.3g} vs output scale {scale:.3g}"
    return diff / scale


def check_against_torch(model: Model, module: Any, inputs: tuple[Any, ...], onnx: bool = True) -> None:
    refs = _torch_outputs(module, inputs)
    feeds = _feeds(model, inputs)
    sim = run_model(model, feeds)
    assert len(model.graph.outputs) == len(refs)
    for value, ref in zip(model.graph.outputs, refs):
        assert_matches(sim[value.name], ref, f"interpreter {value.name}")
    if onnx:
        for value, got, ref in zip(model.graph.outputs, _onnx_outputs(model, feeds), refs):
            assert_matches(got, ref, f"onnxruntime {value.name}")


# ----------------------------------------------------------------------------- the seed model
def test_seed_basic_module_needs_no_preparation() -> None:
    import qcc.driver

    torch.manual_seed(0)
    module = BasicModule(8, 8, 1)
    _randomize_bn(module)
    module.train()
    x = torch.randn(2, 8, 6, 6)
    model = qcc.driver.load(module, example_inputs=(x,))
    assert module.training, "the caller's training flag is restored"
    names = [n.name for n in model.graph.nodes]
    assert names == ["conv1", "bn1", "relu", "conv2", "bn2", "add", "relu_1", "cat", "sigmoid"]
    relus = [n for n in model.graph.nodes if n.op == "Relu"]
    assert [n.name for n in relus] == ["relu", "relu_1"]
    assert relus[0].outputs[0] is not relus[1].outputs[0]
    producer = relus[1].input(0).producer()
    assert producer is not None and producer.op == "Add"  # the += ran between the two calls
    assert [v.name for v in model.graph.inputs] == ["x"] and [v.name for v in model.graph.outputs] == ["output"]
    assert {c.name for c in model.graph.constants} >= {"conv1.weight", "bn1.running_var", "bn2.bias"}
    assert all(c.const is not None and c.const.dtype == np.float32 for c in model.graph.constants)
    assert model.metadata["torch_decomposed"] is False
    check_against_torch(model, module, (x,))
    renamed = load_module(module, x, input_names=["image"])
    assert [v.name for v in renamed.graph.inputs] == ["image"]


# ----------------------------------------------------------------------------- torchvision
TORCHVISION = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1",
               "efficientnet_b0"]
COMPARED_IN_TESTS = ["mobilenet_v3_small", "shufflenet_v2_x0_5"]
"""Squeeze-excitation, hardswish, channel shuffle, depthwise: the others' ops and more;
bench/model_sweeps.py compares all of TORCHVISION (docs/benchmarks.md)."""


@pytest.mark.parametrize("name", COMPARED_IN_TESTS)
def test_torchvision_model_matches_torch(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    module = getattr(torchvision.models, name)(weights=None).eval()
    _randomize_bn(module)
    x = torch.randn(1, 3, 224, 224)
    model = load_module(module, (x,))
    check_against_torch(model, module, (x,))
    names = [n.name for n in model.graph.nodes]
    assert len(names) == len(set(names))
    assert not any(n.op == "Identity" for n in model.graph.nodes)


# ----------------------------------------------------------------------------- LSTM
class LstmNet(nn.Module):
    def __init__(self, batch_first: bool, bidirectional: bool = False) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 10, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)

    def forward(self, x, h0=None, c0=None):
        return self.lstm(x) if h0 is None else self.lstm(x, (h0, c0))


@pytest.mark.parametrize(("batch_first", "bidirectional", "given_state"),
                         [(True, False, False), (False, False, False), (True, True, True)])
def test_lstm_is_unrolled_and_matches_torch(batch_first: bool, bidirectional: bool, given_state: bool) -> None:
    torch.manual_seed(1)
    module = LstmNet(batch_first, bidirectional).eval()
    batch, steps, dirs = 3, 4, 2 if bidirectional else 1
    x = torch.randn(batch, steps, 6) if batch_first else torch.randn(steps, batch, 6)
    inputs = (x, torch.randn(2 * dirs, batch, 10), torch.randn(2 * dirs, batch, 10)) if given_state else (x,)
    model = load_module(module, inputs)
    check_against_torch(model, module, inputs)
    nodes = {n.name: n for n in model.graph.nodes}
    last = steps - 1
    assert nodes[f"lstm.l1.t{last}.ih"].op == "Dense" and nodes[f"lstm.l1.t{last}.hh"].op == "Dense"
    assert nodes[f"lstm.l0.t{last}.i"].op == "Sigmoid" and nodes[f"lstm.l0.t{last}.g"].op == "Tanh"
    assert nodes["lstm"].op == "Concat"  # the output sequence carries the call site's name
    dense = [n for n in model.graph.nodes if n.op == "Dense"]
    first_steps = 0 if given_state else 2 * dirs  # zero initial states need no hh projection
    assert len(dense) == 2 * dirs * (2 * steps) - first_steps
    if bidirectional:
        assert "lstm.l1_reverse.t0.h" in nodes


# ----------------------------------------------------------------------------- op coverage
class OpZoo(nn.Module):
    """Many ATen ops at once: padding modes, dilation, groups, pooling variants, views, arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 4, padding="same")
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.c3 = nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=4)
        self.c4 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.amp = nn.AdaptiveMaxPool2d(2)
        self.aap = nn.AdaptiveAvgPool2d((2, 4))
        self.fc = nn.Linear(8, 5)
        self.ln = nn.LayerNorm(5)
        self.act = nn.Hardswish()
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        y = self.c3(self.c2(self.c1(x)))
        y = F.relu6(self.bn(y)) * 2 - 1
        y = F.leaky_relu(y, 0.2) + F.elu(y) / 3 + F.gelu(y) + torch.tanh(y) * F.hardsigmoid(y) + F.silu(y)
        y = (1 - y).add(self.act(y), alpha=0.5)
        s = F.log_softmax(self.drop(self.amp(y).flatten(1)), dim=1)
        t = self.ln(self.fc(y.permute(0, 2, 3, 1)))
        p = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=False) + F.max_pool2d(y, 3, 2, 1, ceil_mode=True)
        q = F.avg_pool2d(y, 3, 2, 1, count_include_pad=True)
        w = torch.stack([y[:, 1:3, ::2], y.chunk(3, 1)[1][:, 1:, ::2]], dim=2)
        v = torch.softmax(self.aap(y), dim=-1)
        return s, t, p, q, y.mean((2, 3)), w, self.up(self.c4(y)), v, torch.clamp(y, -0.5, 0.5).select(1, -1)


@pytest.mark.parametrize("decomposed", [False, True], ids=["export-ir", "core-aten"])
def test_op_zoo_matches_torch(decomposed: bool) -> None:
    torch.manual_seed(2)
    module = OpZoo().eval()
    _randomize_bn(module)
    x = torch.randn(2, 3, 8, 8)
    if decomposed:
        program = torch.export.export(module, (x,)).run_decompositions(decomposition_table(torch))
        model = load_exported(program)
    else:
        model = load_module(module, (x,))
    check_against_torch(model, module, (x,))
    ops = {n.op for n in model.graph.nodes}
    assert {"Pad", "ConvTranspose", "LogSoftmax", "HardSwish", "Dense", "Split", "MaxPool", "AvgPool"} <= ops
    pads = {n.name: n.attrs["mode"] for n in model.graph.nodes if n.op == "Pad"}
    assert pads["c2.pad"] == "reflect"  # padding_mode='reflect' is a Pad inside the conv's call site


def test_inplace_op_on_an_aliased_tensor_is_functionalized() -> None:
    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            flat = y.view(1, -1)  # an alias of y, read after y is mutated in place
            y.relu_()
            return flat * 2, y

    module = Aliased().eval()
    x = torch.randn(1, 3, 4, 4)
    model = load_module(module, (x,))
    assert model.metadata["torch_decomposed"] is True
    check_against_torch(model, module, (x,), onnx=False)


# ----------------------------------------------------------------------------- .pt2 and errors
class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        y = self.pool(F.hardswish(self.bn(self.conv(x))))
        return self.fc(y.view(y.size(0), -1))


def _qcc(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(QCC)] if QCC.exists() else [sys.executable, "-m", "qcc"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_pt2_with_dynamic_batch_compiles_through_the_cli(tmp_path: Path) -> None:
    torch.manual_seed(3)
    module = SmallNet().eval()
    _randomize_bn(module)
    batch = torch.export.Dim("batch")
    program = torch.export.export(module, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "m.pt2"))
    proc = _qcc("compile", str(tmp_path / "m.pt2"), "-o", str(tmp_path / "m.onnx"))
    assert proc.returncode == 0, proc.stderr
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["output"]
    x = torch.randn(3, 3, 8, 8)  # another batch size than traced
    assert_matches(sess.run(None, {"x": x.numpy()})[0], _torch_outputs(module, (x,))[0], "onnxruntime")


class Sorter(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = Sorter()
        self.tail = Sorter()

    def forward(self, x):
        y = self.conv(x)
        return self.head(y) + self.tail(y) + torch.sort(y, dim=1).values + torch.fft.rfft(y, dim=1).abs().sum()


def test_unsupported_ops_are_listed_once_with_paths_and_counts(tmp_path: Path) -> None:
    program = torch.export.export(Unsupported().eval(), (torch.randn(1, 3, 8, 8),))
    with pytest.raises(UnsupportedError) as info:
        load_exported(program, source="bad")
    message = str(info.value)
    assert "\n" not in message and message.startswith("bad: unsupported ATen op(s): ")
    assert "aten.sort.default x3 at '<top>', 'head', 'tail'" in message
    assert "aten._fft_r2c.default x1 at '<top>'" in message
    torch.export.save(program, str(tmp_path / "bad.pt2"))
    proc = _qcc("compile", str(tmp_path / "bad.pt2"), "-o", str(tmp_path / "bad.onnx"))
    assert proc.returncode == 4
    line = one_error_line(proc)
    assert "unsupported" in line and "aten.sort.default x3" in line and "'head'" in line
    assert not (tmp_path / "bad.onnx").exists()


def test_without_torch_everything_else_works(tmp_path: Path) -> None:
    (tmp_path / "m.pt2").write_bytes(b"not read")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        from qcc.cli import main
        from qcc.errors import UnsupportedError
        import qcc.frontends.torch as fe
        assert main(["compile", {str(DIGITS / "digits_cnn.onnx")!r}, "-o", {str(tmp_path / "d.onnx")!r}]) == 0
        assert not fe.FRONTEND.accepts(object())
        try:
            fe.load_module(object(), ())
        except UnsupportedError as exc:
            print("API:", exc)
        print("CLI:", main(["compile", {str(tmp_path / "m.pt2")!r}, "-o", {str(tmp_path / "m.onnx")!r}]))
    """)
    env = dict(os.environ, QCC_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert "API:" in proc.stdout and "pip install 'qcc[torch]'" in proc.stdout
    assert "CLI: 4" in proc.stdout
    assert "pip install 'qcc[torch]'" in proc.stderr
    assert (tmp_path / "d.onnx").exists() and not (tmp_path / "m.onnx").exists()
