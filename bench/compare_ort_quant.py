"""ONNX QDQ: qcc vs onnxruntime.quantization.quantize_static on the same model and calibration data.

Each tool runs in its own subprocess (wall time and peak RSS from os.wait4): qcc through its CLI
(`qcc compile --target onnx-qdq --quantize uint8 --method M`), ONNX Runtime as its documentation
recommends (quant_pre_process, then quantize_static in QDQ format with MinMax / Entropy /
Percentile, per channel on and off, uint8 activations and int8 weights, plus ORT's own defaults).
Every produced model is then run in ONNX Runtime (default optimizations): accuracy (digits) or
top-1 agreement with the float model, SQNR of the logits against float, file size, how many
compute ops ORT still runs in float, and single-thread latency (median of --runs).

Models: the bundled digits CNN (examples/digits, its calibration and test splits) and the onnx
package's light_resnet50 / light_densenet121 with seeded random weights (tests/onnx_zoo.py),
random normal calibration and evaluation inputs, and the final Softmax removed so the SQNR
measures logits.

Each qcc row's 'vs quantize_static' is quantize_static's time over qcc's for the same method, weight
granularity and activation type, both measured in this run: qcc int8 per-channel against
quantize_static int8 MinMax per-channel, qcc int8 per-tensor against quantize_static's defaults
(int8 MinMax per-tensor). The pairing before branch qs10 (qcc int8 per-channel against the per-tensor
defaults) is kept as its own line under each table; with
--repeat N each tool runs N times per config and the fastest run counts (the machine is shared).
Both tools run with their Python bytecode compiled, as installed packages do (bench/bytecode.py:
a development checkout run with PYTHONDONTWRITEBYTECODE would compile qcc's sources in every run).

Run: .venv/bin/python bench/compare_ort_quant.py [--models digits,resnet50,densenet121]
     [--samples 8] [--eval-samples 16] [--runs 20] [--repeat 1] [--no-write]
Results are printed and written to docs/benchmarks.md under "## ONNX QDQ vs quantize_static".
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bytecode import compiled_env  # noqa: E402
from bench.doc_section import DOC, replace_section  # noqa: E402
from tests import ort_quant  # noqa: E402
from tests.onnx_zoo import random_input, randomized_bytes  # noqa: E402

SECTION = "## ONNX QDQ vs quantize_static"
DIGITS = ROOT / "examples" / "digits"


@attrs.frozen
class Case:
    name: str
    model: Path
    calib: Path
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    static_batch: bool


@attrs.frozen
class Row:
    tool: str
    config: str
    wall_s: float
    peak_mb: float
    path: Path
    pair: str  # method, granularity and activation type: the same for the two tools' matching rows
    legacy: str = ""  # the pairing before branch qs10 (qcc int8 per-channel vs the per-tensor defaults)


def light_model(name: str, out: Path) -> tuple[str, tuple[int, ...]]:
    """The randomized light model at opset 13, without its final Softmax and initializer-backed inputs."""
    import onnx
    from onnx import version_converter

    model = onnx.load_from_string(randomized_bytes(name))
    graph = model.graph
    last = graph.node[-1]
    if last.op_type == "Softmax":
        graph.output[0].name = last.input[0]
        del graph.node[-1]
    inits = {t.name for t in graph.initializer}
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]  # drop the removed ConstantOfShape shapes
    del graph.initializer[:]
    graph.initializer.extend(kept)
    real = [i for i in graph.input if i.name not in inits]
    del graph.input[:]
    graph.input.extend(real)
    model.ir_version = max(model.ir_version, 7)  # initializers need not be inputs from IR 4 on
    # opset 9 -> 13 for both tools: quantize_static keeps the model's opset and then writes
    # per-channel DequantizeLinear (axis needs opset 13) into an invalid model
    model = version_converter.convert_version(model, 13)
    onnx.save(model, str(out))
    dims = tuple(int(d.dim_value) for d in real[0].type.tensor_type.shape.dim)
    return real[0].name, dims


def prepare(name: str, work: Path, samples: int, eval_samples: int) -> Case:
    if name == "digits":
        test = np.load(DIGITS / "test.npz")
        return Case(name, DIGITS / "digits_cnn.onnx", DIGITS / "calib.npz", {"x": test["x"]}, test["labels"], False)
    model = work / f"light_{name}.onnx"
    input_name, dims = light_model(name, model)
    calib = work / f"{name}_calib.npz"
    np.savez(calib, **{input_name: random_input((samples, *dims[1:]), seed=0)})
    feeds = {input_name: random_input((eval_samples, *dims[1:]), seed=1)}
    return Case(name, model, calib, feeds, None, dims[0] == 1)


LAUNCHER = """
import os, subprocess, sys, time
out, argv = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
proc = subprocess.Popen(argv)
_, status, usage = os.wait4(proc.pid, 0)
with open(out, "w") as fh:
    fh.write(f"{time.perf_counter() - start} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


ENV: dict[str, str] | None = None
"""The timed processes' environment: compiled bytecode, as an installed package (bench/bytecode.py)."""


def best_of(repeat: int, argv: list[str], log: Path) -> tuple[float, float]:
    """The fastest of `repeat` runs (wall seconds) and the largest peak RSS (MB)."""
    runs = [measured(argv, log) for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def measured(argv: list[str], log: Path) -> tuple[float, float]:
    """Run argv; (wall seconds, peak RSS MB) of that process alone.

    A small launcher process starts the tool: Linux keeps a process's peak RSS across exec, so a
    tool spawned straight from this (large) process would report this process's size.
    """
    stats = log.with_suffix(".rusage")
    with open(log, "w") as fh:
        code = subprocess.call([sys.executable, "-c", LAUNCHER, str(stats), *argv], stdout=fh,
                               stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} failed; log: {log.read_text()[-2000:]}")
    wall, maxrss_kb = stats.read_text().split()
    return float(wall), float(maxrss_kb) / 1024


def run_tools(case: Case, work: Path, qcc_methods: list[str], repeat: int = 1,
              like_for_like: bool = False) -> list[Row]:
    rows = []
    qcc_configs = [(f"uint8 {m}", ["--quantize", "uint8", "--method", m], f"uint8 {m}") for m in qcc_methods]
    qcc_configs.append(("uint8 minmax per-tensor", ["--quantize", "uint8", "--per-tensor", "--method", "minmax"],
                        "uint8 minmax per-tensor"))
    qcc_configs.append(("int8 minmax", ["--quantize", "int8", "--method", "minmax"], "int8 minmax"))
    qcc_configs.append(("int8 minmax per-tensor", ["--quantize", "int8", "--per-tensor", "--method", "minmax"],
                        "int8 minmax per-tensor"))
    if like_for_like:  # quantize_static's work only: calibrate, quantize, write (no bias correction)
        qcc_configs += [(f"{config}, no bias-correct", [*extra, "--no-bias-correct", "--no-equalize"], pair)
                        for config, extra, pair in list(qcc_configs)]
    for i, (config, extra, pair) in enumerate(qcc_configs):
        out = work / f"{case.name}_qcc{i}.onnx"
        argv = [sys.executable, "-m", "qcc", "compile", str(case.model), "-o", str(out), "--target", "onnx-qdq",
                "--calib", str(case.calib), *extra]
        wall, peak = best_of(repeat, argv, work / f"{case.name}_qcc{i}.log")
        legacy = "int8 minmax per-tensor" if pair == "int8 minmax" else ""
        rows.append(Row("qcc", config, wall, peak, out, pair, legacy))
    ort_configs = [(m, pc, "uint8") for m in ort_quant.ORT_METHODS for pc in (True, False)]
    ort_configs.append(("MinMax", True, "int8"))  # the per-channel pair of qcc's int8
    ort_configs.append(("MinMax", False, "int8"))  # quantize_static's own defaults
    for i, (method, per_channel, act) in enumerate(ort_configs):
        out = work / f"{case.name}_ort{i}.onnx"
        argv = [sys.executable, __file__, "--ort-worker", str(case.model), str(case.calib), str(out), method,
                str(int(per_channel)), act, str(int(case.static_batch))]
        wall, peak = best_of(repeat, argv, work / f"{case.name}_ort{i}.log")
        granularity = "" if per_channel else " per-tensor"
        defaults = " (defaults)" if act == "int8" and not per_channel else ""
        rows.append(Row("quantize_static", f"{act} {method}{granularity}{defaults}", wall, peak, out,
                        f"{act} {method.lower()}{granularity}"))
    return rows


def speedups(rows: list[Row], legacy: bool = False) -> dict[str, float]:
    """quantize_static's time over qcc's, by qcc config, for the configs both tools ran (legacy: the
    pairing before branch qs10, qcc int8 per-channel against the per-tensor defaults)."""
    anchor = {r.pair: r.wall_s for r in rows if r.tool == "quantize_static"}
    pair = (lambda r: r.legacy) if legacy else (lambda r: r.pair)
    return {r.config: anchor[pair(r)] / r.wall_s for r in rows if r.tool == "qcc" and pair(r) in anchor}


def import_baselines(work: Path) -> str:
    """What each tool's process costs before it reads a model (its imports)."""
    parts = []
    for tool, code in (("qcc", "import qcc.cli, qcc.driver, qcc.backends.onnx_qdq, onnx"),
                       ("quantize_static", "import onnxruntime.quantization")):
        wall, peak = measured([sys.executable, "-c", code], work / "import.log")
        parts.append(f"{tool} {wall:.1f} s / {peak:.0f} MB")
    return "Imports alone (included in the tool columns): " + ", ".join(parts) + "."


def float_ops(model: Path) -> str:
    """How many nodes ORT runs on float data, and the most frequent kinds."""
    ops = ort_quant.float_ops(model)
    kinds = ", ".join(f"{op} {n}" for op, n in ops.most_common(2))
    return f"{sum(ops.values())}" + (f" ({kinds})" if kinds else "")


def latencies(models: list[Path], feed: dict[str, np.ndarray], runs: int) -> list[float]:
    """Median single-thread latency (ms) of each model, runs interleaved so load changes hit all alike."""
    import time

    sessions = [ort_quant.session(m, threads=1) for m in models]
    times: list[list[float]] = [[] for _ in models]
    for sess in sessions:
        sess.run(None, feed)
    for _ in range(runs):
        for sess, acc in zip(sessions, times):
            start = time.perf_counter()
            sess.run(None, feed)
            acc.append(time.perf_counter() - start)
    return [1000 * float(np.median(t)) for t in times]


def evaluate(case: Case, rows: list[Row], runs: int) -> list[str]:
    ref = ort_quant.run(case.model, case.feeds)
    quality = "accuracy" if case.labels is not None else "top-1 agreement"
    lines = [
        f"### {case.name}",
        "",
        f"| tool | config | {quality} | logits SQNR (dB) | size (KB) | float ops in ORT | latency (ms) | "
        "tool time (s) | vs quantize_static | tool peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratio = speedups(rows)

    def score(y: np.ndarray) -> float:
        return ort_quant.top1(y, case.labels if case.labels is not None else ref.argmax(axis=1))

    batch = 1 if case.static_batch else len(case.labels if case.labels is not None else ref)
    lat = latencies([case.model, *(r.path for r in rows)], {k: v[:batch] for k, v in case.feeds.items()}, runs)
    lines.append(f"| float | - | {score(ref):.4f} | - | {case.model.stat().st_size / 1024:.0f} | "
                 f"{float_ops(case.model)} | {lat[0]:.2f} | - | - | - |")
    for row, ms in zip(rows, lat[1:]):
        y = ort_quant.run(row.path, case.feeds)
        vs = f"{ratio[row.config]:.1f}x faster" if row.config in ratio and row.tool == "qcc" else "-"
        lines.append(
            f"| {row.tool} | {row.config} | {score(y):.4f} | {ort_quant.sqnr_db(y, ref):.2f} | "
            f"{row.path.stat().st_size / 1024:.0f} | {float_ops(row.path)} | {ms:.2f} | "
            f"{row.wall_s:.1f} | {vs} | {row.peak_mb:.0f} |")
    qcc_rows = [r for r in rows if r.tool == "qcc" and r.config in ratio]
    if qcc_rows:
        ort_peak = min(r.peak_mb for r in rows if r.tool == "quantize_static")
        lines += ["", f"qcc / quantize_static time ratio: {', '.join(f'{r.config} {1 / ratio[r.config]:.2f}' for r in qcc_rows)} "
                      f"(quantize_static {min(ratio.values()):.1f}x to {max(ratio.values()):.1f}x slower); "
                      f"qcc peak RSS at most {max(r.peak_mb for r in qcc_rows):.0f} MB, quantize_static at least "
                      f"{ort_peak:.0f} MB."]
    old = speedups(rows, legacy=True)
    if old:
        lines += ["", "The pairing before branch qs10, qcc int8 per-channel against quantize_static's per-tensor "
                      "defaults: " + ", ".join(f"{config} {x:.1f}x faster" for config, x in old.items()) + "."]
    return lines


def write_section(lines: list[str], args: argparse.Namespace) -> None:
    import onnxruntime

    head = [
        SECTION,
        "",
        f"`bench/compare_ort_quant.py`, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"onnxruntime {onnxruntime.__version__}; {args.samples} random calibration samples and "
        f"{args.eval_samples} random evaluation samples for the light models (digits: its 359 calibration "
        "and 360 test images). Latency: one batch (light models: 1 sample; digits: its 360 test images), "
        "single thread, default ORT optimizations, median of "
        f"{args.runs} runs interleaved across the models of a table. 'float ops in ORT': nodes of ORT's optimized graph "
        "that compute on float data, QuantizeLinear/DequantizeLinear not counted (0 = every op runs in an "
        "integer kernel), with the most frequent kinds. "
        f"Tool times: the fastest of {args.repeat} run(s) per config. 1-minute load average at the start "
        f"{args.load_at_start:.1f}, at the end {os.getloadavg()[0]:.1f} (other jobs share the machine).",
        "",
    ]
    replace_section(SECTION, "\n".join(head + lines) + "\n", DOC)


def ort_worker(argv: list[str]) -> None:
    model, calib, out, method, per_channel, act, static = argv
    data = dict(np.load(calib))
    ort_quant.quantize_static(model, out, data, method, per_channel == "1", act,
                              batch_size=1 if static == "1" else None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--models", default="digits,resnet50,densenet121")
    ap.add_argument("--samples", type=int, default=8, help="calibration samples for the light models")
    ap.add_argument("--eval-samples", type=int, default=16)
    ap.add_argument("--runs", type=int, default=20, help="latency runs (median)")
    ap.add_argument("--qcc-methods", default="minmax,percentile,entropy")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool config; the fastest counts")
    ap.add_argument("--like-for-like", action="store_true",
                    help="also each qcc config with --no-bias-correct --no-equalize (quantize_static's work)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--ort-worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ort_worker:
        ort_worker(args.ort_worker)
        return
    args.load_at_start = os.getloadavg()[0]
    lines: list[str] = []
    global ENV
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ENV = compiled_env(work)
        lines += [import_baselines(work), ""]
        print(lines[0], flush=True)
        for name in args.models.split(","):
            case = prepare(name, work, args.samples, args.eval_samples)
            rows = run_tools(case, work, args.qcc_methods.split(","), args.repeat, args.like_for_like)
            part = evaluate(case, rows, args.runs)
            print("\n".join(part) + "\n", flush=True)
            lines += [*part, ""]
    if not args.no_write:
        write_section(lines, args)
        print(f"written to {DOC}")


if __name__ == "__main__":
    main()
