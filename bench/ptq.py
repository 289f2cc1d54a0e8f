"""Post-training quantization where it breaks (issue 18): each technique's effect and its cost.

    .venv/bin/python bench/ptq.py [--sections mobilenet,torchvision,heavy,w4a8,fixed4,fixed8,time,budget] [--nets torchvision] [--no-write]

Models (tests/ptq_models.py, nothing downloaded): the MobileNetV2-style digits network (dead
channels: folded depthwise ranges > 100x apart), torchvision's mobilenet_v2 with random weights
(BatchNorm statistics from a few training-mode batches of random images, 96x96), the heavy-tailed
digits CNN, and the bundled digits CNN. Compile times cover the digits nets (1078 calibration
images of 8x8) and the torchvision net (16 calibration images of 96x96), where the passes that
run the model on calibration samples weigh more against calibration itself. Each row is a `qcc.compile` with the options named; "old
defaults" is what qcc did before issue 18 (method minmax, mse for fixed8; no equalize, no bias
correction). onnxruntime's quantize_static runs as tests/ort_quant.py runs it (quant_pre_process,
QDQ, uint8 activations, int8 weights). Accuracy and SQNR are measured on the test split; "ORT"
columns run the written QDQ file in onnxruntime with graph optimizations off (the QDQ arithmetic
in float: ORT's int8 kernels saturate on AVX2 without VNNI, docs/quantization.md), "runtime"
columns for fixed point run the written .nnb decoded back (backends/nnb/lift.py) and the
gcc-built C program (target c), both compared bit for bit with qcc's simulator. Compile times:
in-process `qcc.compile` wall time, best of 3, the old-default row measured in the same run; the
compile-time section also gives CPU time (this process, or the `qcc compile` child, all threads);
`--anchor PY` adds `qcc compile` of another checkout (e.g. main 5008265, before issue 18) with its
own defaults, timed in the same interleaved rounds. `qcc compile` processes run with compiled
bytecode (bench/bytecode.py), as an installed qcc does; a second table times the old flags with
each of issue 18's default techniques turned back on alone.
Results go to docs/benchmarks.md, section "Post-training quantization".
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bytecode import compiled_env  # noqa: E402
from bench.doc_section import DOC, replace_section  # noqa: E402
from tests import ort_quant  # noqa: E402
from tests.ptq_models import DIGITS, NetFiles, heavy_tailed_digits, mobilenet_digits  # noqa: E402

SECTION = "## Post-training quantization"
OLD = {"equalize": False, "bias_correct": False}


def old_method(scheme: str) -> str:
    return "mse" if scheme == "fixed8" else "minmax"


def compile_timed(files: NetFiles, out: Path, repeat: int = 1, **options: Any) -> tuple[Any, dict[str, Any], float]:
    from qcc.driver import compile as qcc_compile

    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = qcc_compile(str(files.model), out, calib=str(files.calib), **options)
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return result[0], result[1], best


def sim_scores(model: Any, files: NetFiles, reference: np.ndarray) -> tuple[float, float]:
    from qcc.sim.interpreter import run_batched

    (name,) = [v.name for v in model.graph.outputs]
    y = run_batched(model, {model.graph.inputs[0].name: files.x}, quantized=True)[name]
    return ort_quant.top1(y, files.labels), ort_quant.sqnr_db(y, reference)


def float_reference(files: NetFiles) -> np.ndarray:
    return ort_quant.run(files.model, {"x": files.x})


def row(cells: list[Any]) -> str:
    return "| " + " | ".join(f"{c:.4f}" if isinstance(c, float) and abs(c) <= 1 else
                             f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells) + " |"


# ---------------------------------------------------------------- MobileNetV2-style digits


def mobilenet_files(work: Path) -> NetFiles:
    folder = work / "mobilenet_digits"
    folder.mkdir(exist_ok=True)
    return mobilenet_digits().save(folder, "mobilenet_digits")


def folded_onnx(files: NetFiles, work: Path) -> Path:
    """The same net with BatchNorm folded into the convolutions, as torch.onnx.export writes it."""
    from qcc.driver import compile as qcc_compile

    out = work / f"{files.model.stem}_folded.onnx"
    qcc_compile(str(files.model), out, passes="fold-bn")
    return out


def ort_rows(model: Path, files: NetFiles, reference: np.ndarray, work: Path, label: str,
             per_channel: tuple[bool, ...] = (False, True)) -> list[str]:
    calib = dict(np.load(files.calib))
    lines = []
    for method in ort_quant.ORT_METHODS:
        for pc in per_channel:
            out = work / f"ort_{model.stem}_{method}_{pc}.onnx"
            ort_quant.quantize_static(model, out, calib, method, pc)
            y = ort_quant.run(out, {"x": files.x}, optimize=False)
            lines.append(row([f"quantize_static {method}" + ("" if pc else " per-tensor") + label,
                              "-", ort_quant.top1(y, files.labels), ort_quant.sqnr_db(y, reference), "-", "-"]))
    return lines


def mobilenet_section(files: NetFiles, work: Path) -> list[str]:
    reference = float_reference(files)
    lines = ["### MobileNetV2-style digits network (per-tensor int8 and FIXED8)", "",
             "| config | top-1 (qcc sim) | top-1 (ORT / runtime) | logits SQNR (dB) | compile (s) | vs old |",
             "|---|---:|---:|---:|---:|---:|",
             row(["float", "-", ort_quant.top1(reference, files.labels), "-", "-", "-"])]
    variants = [
        ("int8 per-tensor, old defaults", {"method": "minmax", **OLD}),
        ("+ method auto", {"equalize": False, "bias_correct": False}),
        ("+ equalize", {"bias_correct": False}),
        ("+ bias-correct (new default)", {}),
    ]
    anchor = None
    for name, opts in variants:
        out = work / "mb_int8.onnx"
        model, _, seconds = compile_timed(files, out, 3, target="onnx-qdq", quantize="int8", per_tensor=True, **opts)
        anchor = anchor or seconds
        top1, sqnr = sim_scores(model, files, reference)
        y = ort_quant.run(out, {"x": files.x}, optimize=False)
        lines.append(row([name, top1, ort_quant.top1(y, files.labels), sqnr, seconds, f"{seconds / anchor:.2f}x"]))
    lines += ort_rows(folded_onnx(files, work), files, reference, work, " (BN folded)")
    lines += ort_rows(files.model, files, reference, work, " (BN unfolded)", per_channel=(False,))
    anchor = None
    for name, opts in [("fixed8 .nnb, old defaults", {"method": "mse", **OLD}),
                       ("+ method auto", {"equalize": False, "bias_correct": False}),
                       ("+ equalize", {"bias_correct": False}), ("+ bias-correct (new default)", {})]:
        model, _, seconds = compile_timed(files, work / "mb.nnb", 3, quantize="fixed8", **opts)
        anchor = anchor or seconds
        top1, sqnr = sim_scores(model, files, reference)
        emulated = nnb_emulation(work / "mb.nnb", files.x, model)
        lines.append(row([name, top1, f"{ort_quant.top1(emulated, files.labels):.4f} (.nnb, bit-exact)", sqnr, seconds,
                          f"{seconds / anchor:.2f}x"]))
    return lines


def nnb_emulation(path: Path, x: np.ndarray, model: Any) -> np.ndarray:
    """The written .nnb decoded back and run by the simulator; must equal the compiled model's run."""
    from qcc.backends.nnb.format import read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    from qcc.sim.fixed import FixedRunner

    lifted = lift_nnb(read_nnb(path.read_bytes(), str(path)))
    got = FixedRunner(lifted).run({lifted.graph.inputs[0].name: x})[lifted.graph.outputs[0].name]
    want = FixedRunner(model).run({model.graph.inputs[0].name: x})[model.graph.outputs[0].name]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "the .nnb does not emulate bit-exactly"
    return got


# ---------------------------------------------------------------- torchvision mobilenet_v2


def torchvision_files(work: Path, size: int = 96, calib: int = 16, test: int = 16) -> NetFiles:
    import torch
    import torchvision

    from qcc.api import write
    from qcc.driver import load

    torch.manual_seed(0)
    torch.set_num_threads(2)
    net = torchvision.models.mobilenet_v2(weights=None)
    net.train()
    with torch.no_grad():  # BatchNorm statistics of random images, as a few training steps would leave them
        for _ in range(4):
            net(torch.randn(16, 3, size, size))
    net.eval()
    rng = np.random.default_rng(0)
    x_calib = rng.standard_normal((calib, 3, size, size)).astype(np.float32)
    x_test = rng.standard_normal((test, 3, size, size)).astype(np.float32)
    batch = torch.export.Dim("N", min=1, max=1024)
    program = torch.export.export(net, (torch.from_numpy(x_calib[:2]),), dynamic_shapes=({0: batch},))
    path = work / "mobilenet_v2.onnx"
    write(load(program, input_names=["x"]), path, target="onnx")
    np.savez(work / "tv_calib.npz", x=x_calib)
    with torch.no_grad():
        labels = net(torch.from_numpy(x_test)).argmax(1).numpy()  # top-1 agreement with float
    np.savez(work / "tv_test.npz", x=x_test, labels=labels)
    return NetFiles(path, work / "tv_calib.npz", work / "tv_test.npz", x_test, labels)


def torchvision_section(files: NetFiles, work: Path) -> list[str]:
    reference = float_reference(files)
    lines = ["### torchvision mobilenet_v2, random weights (96x96, 16 calibration and 16 test images)", "",
             "| config | top-1 agreement (qcc sim) | logits SQNR (dB, qcc sim) | logits SQNR (dB, ORT) | compile (s) |",
             "|---|---:|---:|---:|---:|"]
    for name, opts in [("int8 per-tensor, no equalization", {"equalize": False, "bias_correct": False}),
                       ("int8 per-tensor, equalize", {"bias_correct": False}),
                       ("int8 per-tensor, equalize + bias-correct (default)", {}),
                       ("int8 per-channel (default)", {"per_tensor": False})]:
        per_tensor = opts.pop("per_tensor", True)
        out = work / "tv.onnx"
        model, _, seconds = compile_timed(files, out, 1, target="onnx-qdq", quantize="int8", per_tensor=per_tensor,
                                          **opts)
        top1, sqnr = sim_scores(model, files, reference)
        y = ort_quant.run(out, {"x": files.x}, optimize=False)
        lines.append(row([name, top1, sqnr, ort_quant.sqnr_db(y, reference), seconds]))
    return lines


def budget_passes(per_tensor: bool, input_values: int) -> str:
    """The int8 default pipeline (docs/passes.md) with equalize's and bias-correct's input-value budget set."""
    fold, equalize = ("fold-bn", f"equalize{{input_values={input_values}}},") if per_tensor else \
        ("fold-bn{standalone=conv}", "")
    return (f"{fold},{equalize}calibrate{{pre_bias=false,reference=16}},"
            f"quantize-affine{{dtype=int8,per_channel={str(not per_tensor).lower()},method=auto}},"
            f"bias-correct{{input_values={input_values}}}")


def budget_section(files: NetFiles, work: Path) -> list[str]:
    """Equalize's and bias-correct's sample budget halved (8 -> 4 of the 16 calibration images at
    96x96) against the defaults and the old flags: what a further cut would cost in SQNR; `qcc
    compile` processes with compiled bytecode, as in the time section."""
    from qcc.quant.samples import INPUT_VALUES

    reference = float_reference(files)
    env = compiled_env(work / "bytecode")
    lines = ["### Sample budget of equalize and bias-correct (torchvision net, `qcc compile` best of 3, interleaved)",
             "", "| scheme | config | wall (s) | vs old flags (wall, CPU) | logits SQNR (dB, ORT) |",
             "|---|---|---:|---:|---:|"]
    for per_tensor in (True, False):
        scheme = ["--target", "onnx-qdq", "--quantize", "int8", *(["--per-tensor"] if per_tensor else [])]
        configs = {"old flags": [*scheme, *old_flags("int8")], "defaults": scheme,
                   f"budget {INPUT_VALUES // 2} values": ["--target", "onnx-qdq", "--passes",
                                                          budget_passes(per_tensor, INPUT_VALUES // 2)]}
        compile_seconds(files, work / "budget.onnx", scheme, env=env)  # untimed: fills the bytecode cache
        best = {name: [float("inf")] * 2 for name in configs}
        for _ in range(3):
            for name, args in configs.items():
                wall, cpu = compile_seconds(files, work / f"budget_{name[:3]}.onnx", args, env=env)
                best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
        (old, old_cpu) = best["old flags"]
        for name, (wall, cpu) in best.items():
            y = ort_quant.run(work / f"budget_{name[:3]}.onnx", {"x": files.x}, optimize=False)
            lines.append(row(["int8" + (" per-tensor" if per_tensor else ""), name, wall,
                              f"{wall / old:.2f}x, {cpu / old_cpu:.2f}x", ort_quant.sqnr_db(y, reference)]))
    return lines


# ---------------------------------------------------------------- heavy tails


def heavy_section(work: Path) -> list[str]:
    test = np.load(DIGITS / "test.npz")
    files = NetFiles(heavy_tailed_digits(work / "heavy.onnx"), DIGITS / "calib.npz", DIGITS / "test.npz",
                     test["x"], test["labels"])
    reference = float_reference(files)
    lines = ["### Heavy-tailed digits CNN (int8 per channel, bias-correct on; SQNR in ORT float simulation)", "",
             "| config | top-1 | logits SQNR (dB) |", "|---|---:|---:|"]
    for method in ("minmax", "percentile", "entropy", "mse", "auto"):
        out = work / f"heavy_{method}.onnx"
        compile_timed(files, out, 1, target="onnx-qdq", quantize="int8", method=method)
        y = ort_quant.run(out, {"x": files.x}, optimize=False)
        label = f"qcc int8 {method}" + (" (default)" if method == "auto" else "")
        lines.append(row([label, ort_quant.top1(y, files.labels), ort_quant.sqnr_db(y, reference)]))
    for line in ort_rows(files.model, files, reference, work, ""):
        cells = line.split(" | ")
        lines.append(" | ".join([cells[0], cells[2], cells[3]]) + " |")
    return lines


# ---------------------------------------------------------------- W4A8


def w4a8_section(nets: dict[str, NetFiles], work: Path) -> list[str]:
    lines = ["### W4A8: int4 weights (per channel), int8 activations", "",
             "| net | rounding | bias-correct | top-1 (qcc sim) | top-1 (ORT) | logits SQNR (dB) | compile (s) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for name, files in nets.items():
        reference = float_reference(files)
        lines.append(row([name, "float", "-", "-", ort_quant.top1(reference, files.labels), "-", "-"]))
        for rounding in ("nearest", "learned"):
            for bias_correct in (False, True):
                out = work / f"w4_{name}.onnx"
                model, _, seconds = compile_timed(files, out, 1, target="onnx-qdq", quantize="int4",
                                                  rounding=rounding, bias_correct=bias_correct)
                top1, sqnr = sim_scores(model, files, reference)
                y = ort_quant.run(out, {"x": files.x}, optimize=False)
                lines.append(row([name, rounding, "yes" if bias_correct else "no", top1,
                                  ort_quant.top1(y, files.labels), sqnr, seconds]))
    return lines


# ---------------------------------------------------------------- fixed4: 4-bit fixed-point weights


def object_bytes(directory: Path, name: str) -> tuple[int, int]:
    """(text + rodata, data + bss) of the model's object file built -Os: flash and static RAM."""
    obj = directory / f"{name}.o"
    subprocess.run(["gcc", "-std=c99", "-Os", "-ffp-contract=off", "-c", "-o", str(obj), str(directory / f"{name}.c")],
                   check=True, capture_output=True)
    text, data, bss = subprocess.run(["size", str(obj)], check=True, capture_output=True,
                                     text=True).stdout.splitlines()[1].split()[:3]
    return int(text), int(data) + int(bss)


def fixed4_section(nets: dict[str, NetFiles], work: Path, c_samples: int) -> list[str]:
    """fixed4 (4-bit fixed-point weights, FIXED8 activations) against fixed8 on nnabla-c-runtime's
    arithmetic (.nnb and C share it): accuracy, SQNR, bit-exactness, and the C object's size."""
    from qcc.backends.c import BACKEND as C_BACKEND

    from qcc.sim.fixed import FixedRunner

    lines = ["### fixed4: 4-bit fixed-point weights, FIXED8 activations (.nnb and C)", "",
             "| net | scheme | rounding | top-1 (qcc sim) | logits SQNR (dB) | compile (s) | .nnb emulation == sim | "
             "C (gcc) == sim | C object text (B) | C arena (B) |",
             "|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    packed_models = {}
    for name, files in nets.items():
        reference = float_reference(files)
        lines.append(row([name, "float", "-", ort_quant.top1(reference, files.labels), "-", "-", "-", "-", "-", "-"]))
        for scheme, rounding, layout in (("fixed8", "nearest", "packed"), ("fixed4", "nearest", "packed"),
                                         ("fixed4", "learned", "int8"), ("fixed4", "learned", "packed")):
            nnb = work / f"f4_{name}.nnb"
            model, _, seconds = compile_timed(files, nnb, 1, quantize=scheme, rounding=rounding)
            top1, sqnr = sim_scores(model, files, reference)
            nnb_emulation(nnb, files.x, model)  # asserts bit-exactness
            c_dir = work / "f4c"
            C_BACKEND.write(model, c_dir, C_BACKEND.make_options(weights4=layout))  # same rules as .nnb
            x = files.x[:c_samples]
            got = c_outputs(c_dir, x)
            want = FixedRunner(model).run({model.graph.inputs[0].name: x})[model.graph.outputs[0].name]
            exact = np.array_equal(got.view(np.uint32), want.reshape(len(x), -1).view(np.uint32))
            text, _ = object_bytes(c_dir, "f4c")
            arena = int((c_dir / "f4c.h").read_text().split("#define F4C_ARENA_SIZE ")[1].split()[0])
            label = f"{scheme} ({'weights two a byte' if layout == 'packed' else 'weights int8'})" \
                if scheme == "fixed4" else scheme
            lines.append(row([name, label, rounding, top1, sqnr, seconds, f"yes ({len(files.x)} images)",
                              f"{'yes' if exact else 'NO'} ({len(x)} images)", text, arena]))
            packed_models[name] = model
    lines += ["", "C option `unpack_bytes` (fixed4 learned, weights two a byte): most weights unpacked at once", "",
              "| net | unpack_bytes | unpack calls | C object text (B) | C arena (B) |", "|---|---:|---:|---:|---:|"]
    for name, model in packed_models.items():
        for limit in (512, 2048, 4096, 1 << 30):
            c_dir = work / "f4c"
            C_BACKEND.write(model, c_dir, C_BACKEND.make_options(unpack_bytes=limit))
            calls = (c_dir / "f4c.c").read_text().count("qcc_unpack4(") - 1
            text, _ = object_bytes(c_dir, "f4c")
            arena = int((c_dir / "f4c.h").read_text().split("#define F4C_ARENA_SIZE ")[1].split()[0])
            lines.append(row([name, "whole layers" if limit == 1 << 30 else limit, calls, text, arena]))
    return lines


# ---------------------------------------------------------------- FIXED8 bias correction, .nnb and C


def c_outputs(directory: Path, x: np.ndarray) -> np.ndarray:
    subprocess.run(["make", "-s", "-C", str(directory), "CFLAGS=-std=c99 -O2 -ffp-contract=off"], check=True,
                   capture_output=True)
    outs = []
    for i, sample in enumerate(x):
        src, dst = directory / f"in{i}.bin", directory / f"out{i}.bin"
        sample.astype("<f4").tofile(src)
        subprocess.run([str(directory / "model"), str(src), str(dst)], check=True, capture_output=True)
        outs.append(np.fromfile(dst, dtype="<f4"))
    return np.stack(outs)


def fixed8_section(nets: dict[str, NetFiles], work: Path, c_samples: int) -> list[str]:
    from qcc.sim.fixed import FixedRunner

    lines = ["### FIXED8 bias correction (.nnb and C)", "",
             "| net | bias-correct | top-1 | logits SQNR (dB) | .nnb emulation == sim | C (gcc) == sim |",
             "|---|---|---:|---:|---|---|"]
    for name, files in nets.items():
        reference = float_reference(files)
        for bias_correct in (False, True):
            model, _, _ = compile_timed(files, work / f"{name}.nnb", 1, quantize="fixed8", bias_correct=bias_correct)
            top1, sqnr = sim_scores(model, files, reference)
            nnb_emulation(work / f"{name}.nnb", files.x, model)  # asserts bit-exactness
            c_dir = work / f"{name}_c"
            c_model, _, _ = compile_timed(files, c_dir, 1, quantize="fixed8", bias_correct=bias_correct)
            x = files.x[:c_samples]
            got = c_outputs(c_dir, x)
            want = FixedRunner(c_model).run({c_model.graph.inputs[0].name: x})[c_model.graph.outputs[0].name]
            exact = np.array_equal(got.view(np.uint32), want.reshape(len(x), -1).view(np.uint32))
            lines.append(row([name, "yes" if bias_correct else "no", top1, sqnr,
                              f"yes ({len(files.x)} images)", f"{'yes' if exact else 'NO'} ({len(x)} images)"]))
    return lines


# ---------------------------------------------------------------- compile time


CLI_FLAGS = {"equalize": "--no-equalize", "bias_correct": "--no-bias-correct"}


def old_flags(scheme: str) -> list[str]:
    """`qcc compile` flags for what qcc did before issue 18."""
    return ["--method", old_method(scheme), *CLI_FLAGS.values()]


def technique_flags(scheme: str, per_tensor: bool) -> dict[str, list[str]]:
    """The old flags with one of issue 18's default techniques turned back on, by name (equalize is
    a default for per-tensor and fixed-point schemes only)."""
    method = ["--method", old_method(scheme)]
    flags = {"method auto": ["--method", "auto", *CLI_FLAGS.values()],
             "bias-correct": [*method, CLI_FLAGS["equalize"]]}
    if per_tensor or scheme.startswith("fixed"):
        flags["equalize"] = [*method, CLI_FLAGS["bias_correct"]]
    return flags


def cli_seconds(files: NetFiles, out: Path, scheme: str, target: str, per_tensor: bool, flags: list[str],
                python: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU time (all threads) of `qcc compile` in a fresh process: what a user waits for,
    imports included (`env`: compiled bytecode, as an installed package, bench/bytecode.py).
    `python` runs another checkout's qcc (its `.venv/bin/python`) with that checkout's own defaults."""
    return compile_seconds(files, out, ["--target", target, "--quantize", scheme, *flags,
                                        *(["--per-tensor"] if per_tensor else [])], python, env)


def compile_seconds(files: NetFiles, out: Path, args: list[str], python: Path | None = None,
                    env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU time (all threads) of `qcc compile MODEL -o OUT --calib CALIB *args` in a fresh process."""
    import resource

    argv = [str(python or sys.executable), "-m", "qcc", "compile", str(files.model), "-o", str(out), "--calib",
            str(files.calib), *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # `-m` puts the working directory first on sys.path: run in the checkout whose qcc is timed
    subprocess.run(argv, check=True, capture_output=True, cwd=python.parents[2] if python else ROOT, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def compile_cpu(files: NetFiles, out: Path, **options: Any) -> tuple[dict[str, Any], float, float]:
    """One in-process compile: (report, wall seconds, CPU seconds of this process, all threads)."""
    cpu = time.process_time()
    _, report, wall = compile_timed(files, out, 1, **options)
    return report, wall, time.process_time() - cpu


def time_section(nets: dict[str, NetFiles], work: Path, anchor: Path | None = None, rounds: int = 3) -> list[str]:
    """`anchor`: the Python of a checkout from before issue 18 (main 5008265), whose `qcc compile`
    with its own defaults is the issue's "today's compile time"; timed in the same interleaved rounds.
    Besides the ratio of the bests, the median over the rounds of each round's `qcc compile` ratio
    (the two processes of a round ran seconds apart: the host's drift between minutes cancels)."""
    at_filing = ["`qcc compile` at filing (s)", "new / at filing", "median", "CPU ratio"] if anchor else []
    lines = [f"### Compile time: new defaults against the old ones (same run, best of {rounds}, interleaved)", "",
             "Wall time and CPU time (all threads: BLAS uses both cores); on a shared machine the CPU "
             "ratio is the steadier one; \"median\": of the rounds' own ratios.", "",
             "| " + " | ".join(["net", "scheme", "target", "in-process old (s)", "new (s)", "ratio", "CPU ratio",
                                "`qcc compile` old (s)", "new (s)", "ratio", "median", "CPU ratio", *at_filing,
                                "passes added"]) + " |",
             "|---|---|---|" + "---:|" * (9 + len(at_filing)) + "---|"]
    inf = float("inf")
    alone: list[str] = []
    # `qcc compile` processes run as installed packages do: with their bytecode compiled (this
    # machine sets PYTHONDONTWRITEBYTECODE, so a checkout would compile its ~140 modules in every
    # process, ~0.2-0.5 s that dilutes the passes' cost in both columns of each ratio)
    env = compiled_env(work / "bytecode", (ROOT, *([anchor.parents[2]] if anchor else [])))
    first = next(iter(nets.values()))
    for python in dict.fromkeys((None, anchor)):  # untimed: the cache fills with the bytecode of what qcc imports
        cli_seconds(first, work / "t.onnx", "int8", "onnx-qdq", False, [], python, env)
    for name, files in nets.items():
        for scheme, target, per_tensor in (("int8", "onnx-qdq", False), ("int8", "onnx-qdq", True),
                                           ("fixed8", "nnb", False), ("fixed16", "nnb", False)):
            out = work / ("t.nnb" if target == "nnb" else "t.onnx")
            best: dict[str, list[float]] = {}
            walls: dict[str, list[float]] = {}
            report: dict[str, Any] = {}
            for _ in range(rounds):  # interleaved: load changes hit both alike
                _, *old_run = compile_cpu(files, out, target=target, quantize=scheme, per_tensor=per_tensor,
                                          method=old_method(scheme), **OLD)
                report, *new_run = compile_cpu(files, out, target=target, quantize=scheme, per_tensor=per_tensor)
                runs = {"old": old_run, "new": new_run,
                        "cli_old": cli_seconds(files, out, scheme, target, per_tensor, old_flags(scheme), env=env),
                        "cli_new": cli_seconds(files, out, scheme, target, per_tensor, [], env=env)}
                if anchor:
                    runs["anchor"] = cli_seconds(files, out, scheme, target, per_tensor, [], anchor, env)
                for technique, flags in technique_flags(scheme, per_tensor).items():
                    runs[technique] = cli_seconds(files, out, scheme, target, per_tensor, flags, env=env)
                for key, (wall, cpu) in runs.items():
                    walls.setdefault(key, []).append(wall)
                    before = best.get(key, [inf, inf])
                    best[key] = [min(before[0], wall), min(before[1], cpu)]
            added = [p for p in report["pipeline"] if p in ("equalize", "bias-correct", "learned-rounding")]
            (old, old_cpu), (new, new_cpu) = best["old"], best["new"]
            (cli_old, cli_old_cpu), (cli_new, cli_new_cpu) = best["cli_old"], best["cli_new"]
            alone.append(row([name, scheme + (" per-tensor" if per_tensor else ""), target, cli_old, *(
                f"{best[t][0] / cli_old:.2f}x, {best[t][1] / cli_old_cpu:.2f}x" if t in best else "-"
                for t in TECHNIQUES), f"{cli_new / cli_old:.2f}x, {cli_new_cpu / cli_old_cpu:.2f}x"]))
            filing: list[Any] = []
            if anchor:
                (then, then_cpu) = best["anchor"]
                filing = [then, f"{cli_new / then:.2f}x", f"{median_ratio(walls['cli_new'], walls['anchor']):.2f}x",
                          f"{cli_new_cpu / then_cpu:.2f}x"]
            lines.append(row([name, scheme + (" per-tensor" if per_tensor else ""), target, old, new,
                              f"{new / old:.2f}x", f"{new_cpu / old_cpu:.2f}x", cli_old, cli_new,
                              f"{cli_new / cli_old:.2f}x", f"{median_ratio(walls['cli_new'], walls['cli_old']):.2f}x",
                              f"{cli_new_cpu / cli_old_cpu:.2f}x", *filing,
                              ", ".join(added) + ", method auto"]))
    return [*lines, "", "### Compile time: each technique alone against the old flags (the same runs)", "",
            "`qcc compile` wall and CPU time of the old flags with one default technique turned back on, over "
            f"the old flags' (best of {rounds} each, in the rounds above, compiled bytecode).", "",
            "| net | scheme | target | `qcc compile` old (s) | " + " | ".join(f"+ {t}" for t in TECHNIQUES)
            + " | new defaults |", "|---|---|---|---:|" + "---:|" * (len(TECHNIQUES) + 1), *alone]


TECHNIQUES = ("method auto", "equalize", "bias-correct")


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of the rounds' own ratios (round k's two runs are paired)."""
    import statistics

    return statistics.median(a / b for a, b in zip(numerators, denominators))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sections", default="mobilenet,torchvision,heavy,w4a8,fixed4,fixed8,time,budget")
    ap.add_argument("--c-samples", type=int, default=40, help="test images run through the C program")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--nets", default="", help="time section: only the nets whose name contains one of these "
                                                 "comma-separated words (default all)")
    ap.add_argument("--rounds", type=int, default=3, help="time section: interleaved rounds")
    ap.add_argument("--anchor", type=Path, default=None,
                    help="time section: .venv/bin/python of a checkout from before issue 18 (e.g. a worktree "
                         "of main 5008265 with the project installed); adds its `qcc compile` time")
    args = ap.parse_args(argv)
    wanted = args.sections.split(",")
    load_start = os.getloadavg()[0]
    parts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        test = np.load(DIGITS / "test.npz")
        digits = NetFiles(DIGITS / "digits_cnn.onnx", DIGITS / "calib.npz", DIGITS / "test.npz", test["x"],
                          test["labels"])
        words = [w for w in args.nets.split(",") if w]
        timed_mobilenet = "time" in wanted and (not words or any(w in "MobileNetV2-style digits" for w in words))
        needs_mobilenet = {"mobilenet", "w4a8", "fixed4", "fixed8"} & set(wanted) or timed_mobilenet
        mobilenet = mobilenet_files(work) if needs_mobilenet else None
        torchvision = torchvision_files(work) if {"torchvision", "time", "budget"} & set(wanted) else None
        nets = {"digits CNN": digits, **({"MobileNetV2-style digits": mobilenet} if mobilenet else {})}
        timed = {**nets, **({"torchvision mobilenet_v2 96x96": torchvision} if torchvision else {})}
        timed = {k: v for k, v in timed.items() if not words or any(w in k for w in words)}
        builders = {
            "mobilenet": lambda: mobilenet_section(mobilenet, work),  # type: ignore[arg-type]
            "torchvision": lambda: torchvision_section(torchvision, work),  # type: ignore[arg-type]
            "heavy": lambda: heavy_section(work),
            "w4a8": lambda: w4a8_section(nets, work),
            "fixed4": lambda: fixed4_section(nets, work, args.c_samples),
            "fixed8": lambda: fixed8_section(nets, work, args.c_samples),
            "time": lambda: time_section(timed, work, args.anchor, args.rounds),
            "budget": lambda: budget_section(torchvision, work),  # type: ignore[arg-type]
        }
        for name in wanted:
            start = time.perf_counter()
            lines = builders[name]()
            lines.append("")
            lines.append(f"(section measured in {time.perf_counter() - start:.0f} s)")
            print("\n".join(lines) + "\n", flush=True)
            parts += [*lines, ""]
    if args.no_write:
        return
    import onnxruntime

    head = [SECTION, "",
            f"`bench/ptq.py`, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
            f"{onnxruntime.__version__}; 1-minute load average {load_start:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end (other jobs share the machine: compare times within a table). "
            "See the script's docstring for what each column measures.", ""]
    replace_section(SECTION, "\n".join(head + parts) + "\n", DOC)
    print(f"written to {DOC}")


if __name__ == "__main__":
    main()
