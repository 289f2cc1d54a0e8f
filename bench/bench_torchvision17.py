"""torchvision models at their full sizes through torch.export (issue 17), random weights.

For each model: qcc's import run by qcc's interpreter and, written as ONNX by qcc, by onnxruntime,
against torch (max |error| over max |output|), and the top class agreement; then a small ViT
quantized to int8 by qcc for target c (bit-exact check of the gcc-built program against
qcc.sim.affine_int) and for onnx-qdq (SQNR of the logits against torch). The test suite checks the
same models at small input sizes (tests/test_torchvision17.py); this is the full-size run.

Run: .venv/bin/python bench/bench_torchvision17.py [--models mobilenet_v3_large,efficientnet_b0,...]
     [--samples 4] [--int8-samples 32] [--no-write]
Results are printed and written to docs/benchmarks.md under "## torchvision models (issue 17)".
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SECTION = "## torchvision models (issue 17)"


def models() -> dict[str, tuple[Any, int]]:
    import torchvision

    m = torchvision.models
    return {
        "mobilenet_v3_large": (lambda: m.mobilenet_v3_large(), 224),
        "efficientnet_b0": (lambda: m.efficientnet_b0(), 224),
        "lraspp_mobilenet_v3_large": (lambda: m.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None), 224),
        "fcn_resnet50": (lambda: m.segmentation.fcn_resnet50(weights_backbone=None, aux_loss=False), 224),
        "vit_b_16": (lambda: m.vit_b_16(), 224),
    }


def float_row(name: str, make: Any, size: int, samples: int) -> str:
    import torch

    import qcc
    from qcc.formats.onnx_export import to_onnx
    from tests.onnx_zoo import ort_run
    from tests.test_torchvision17 import randomized, torch_output

    net = randomized(make)
    x = torch.randn(samples, 3, size, size, generator=torch.Generator().manual_seed(0))
    want = np.concatenate([torch_output(net, x[i:i + 1]) for i in range(samples)])
    start = time.perf_counter()
    model = qcc.load(net, example_inputs=x[:1])
    load_s = time.perf_counter() - start
    name_in, name_out = model.graph.inputs[0].name, model.graph.outputs[0].name
    got = np.concatenate([qcc.run(model, {name_in: x.numpy()[i:i + 1]})[name_out] for i in range(samples)])
    proto = to_onnx(model).SerializeToString()
    ort = np.concatenate([ort_run(proto, {name_in: x.numpy()[i:i + 1]})[0] for i in range(samples)])
    scale = float(np.max(np.abs(want)))
    agree = float(np.mean(got.argmax(1) == want.argmax(1)))
    ops = len({n.op for n in model.graph.nodes})
    return (f"| {name} | {size} | {len(model.graph.nodes)} ({ops} ops) | {load_s:.1f} | "
            f"{np.max(np.abs(got - want)) / scale:.1e} | {np.max(np.abs(ort - want)) / scale:.1e} | {agree:.2f} |")


def vit_int8(samples: int) -> list[str]:
    import torch

    import qcc
    from qcc.sim.affine_int import run_affine_int
    from tests import ort_quant
    from tests.op_check import c_outputs
    from tests.test_torchvision17 import small_vit, torch_output

    net = small_vit()
    x = torch.randn(64 + samples, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    want = torch_output(net, x[64:])
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "calib.npz", x=x.numpy()[:64])
        compiled, report = qcc.compile(qcc.load(net, example_inputs=x[:1]), Path(tmp) / "vit_c", target="c",
                                       quantize="int8", calib=str(Path(tmp) / "calib.npz"))
        name = compiled.graph.inputs[0].name
        sim = np.concatenate([run_affine_int(compiled, {name: x.numpy()[64 + i:65 + i]})[compiled.graph.outputs[0].name]
                              for i in range(samples)])
        exact = np.array_equal(c_outputs(compiled, {name: x.numpy()[64:]}, Path(tmp) / "build", sanitize=False), sim)
        _, qreport = qcc.compile(qcc.load(net, example_inputs=x[:1]), Path(tmp) / "vit.onnx", quantize="int8",
                                 calib=str(Path(tmp) / "calib.npz"))
        qdq = np.concatenate([ort_quant.run(Path(tmp) / "vit.onnx", {name: x.numpy()[64 + i:65 + i]})
                              for i in range(samples)])
        fused = ort_quant.fused_ops(Path(tmp) / "vit.onnx")
    islands = sorted({i["op"] for i in report["c"]["float_islands"]})
    return [f"| C int8 (target c) | {ort_quant.sqnr_db(sim, want):.1f} | bit-exact with qcc.sim.affine_int: {exact}; "
            f"float islands: {', '.join(islands)} |",
            f"| onnx-qdq int8 in onnxruntime | {ort_quant.sqnr_db(qdq, want):.1f} | QLinearMatMul {fused['QLinearMatMul']}, "
            f"QGemm {fused['QGemm']}, QLinearSoftmax {fused['QLinearSoftmax']}; float islands: "
            f"{', '.join(sorted({i['op'] for i in qreport['onnx-qdq']['float_islands']}))} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models()))
    parser.add_argument("--samples", type=int, default=4, help="random inputs per full-size model")
    parser.add_argument("--int8-samples", type=int, default=32, help="evaluation inputs of the int8 ViT")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    table = models()
    lines = [SECTION, "",
             f"`bench/bench_torchvision17.py` on {platform.machine()}, Python {platform.python_version()}, "
             f"{datetime.date.today()}; random weights, {args.samples} random inputs per model. Error: max |difference| "
             "over max |torch output| (1e-6 is float32 rounding); agreement: same arg-max class (segmentation: per "
             "pixel row of the first axis) as torch.", "",
             "| model | input | IR nodes | import s | qcc vs torch | ORT (qcc's ONNX) vs torch | same class |",
             "|---|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        make, size = table[name]
        row = float_row(name, make, size, args.samples)
        print(row, flush=True)
        lines.append(row)
    lines += ["", "Small ViT (2 layers, 2 heads, width 32, 32x32 input), 64 calibration and "
              f"{args.int8_samples} evaluation samples, SQNR of the logits against torch:", "",
              "| int8 | SQNR dB | notes |", "|---|---|---|", *vit_int8(args.int8_samples)]
    lines += ["", f"1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
              "(other jobs share the machine).", ""]
    print("\n".join(lines[-6:]))
    if not args.no_write:
        from bench.doc_section import replace_section

        replace_section(SECTION, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
