"""Benchmark target c: latency against onnxruntime, code/data size, arena against the bounds.

    .venv/bin/python bench/bench_c.py [--models digits squeezenet shufflenet] [--repeats 200]
                                      [--record docs/benchmarks.md]

Per model and numeric mode: the generated C built with `gcc -std=c99 -O2` and run on one core
(`taskset -c 0`; the code is single-threaded) through its main.c (`./model IN OUT REPEATS`, mean
CPU time per inference), against onnxruntime with one intra-op and one inter-op thread and all
graph optimizations on the same float model, and on qcc's int8 QDQ model (target onnx-qdq,
--quantize int8). `size` of the model's object file gives text/data/bss (weights are in .rodata,
counted in text by Berkeley `size`). The arena is compared with LB_off (max live bytes), the
no-reuse sum, and the shared-object plans a .nnb file would use (qcc's and nnabla's policy).
`--record` replaces (or appends) the "C backend" section of a markdown file (bench/doc_section.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HEADING = "## C backend"
DIGITS = ROOT / "examples" / "digits"


def model_source(name: str, tmp: Path) -> tuple[Path, Path | None]:
    """(float ONNX file, calibration npz or None)."""
    if name == "digits":
        return DIGITS / "digits_cnn.onnx", DIGITS / "calib.npz"
    from tests.onnx_zoo import randomized_bytes

    path = tmp / f"{name}.onnx"
    path.write_bytes(randomized_bytes(name))
    return path, None


def build(directory: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(directory), "CFLAGS=-std=c99 -O2 -ffp-contract=off"], check=True,
                   capture_output=True)
    return directory / "model"


def c_latency(exe: Path, x: np.ndarray, repeats: int) -> float:
    """Mean microseconds per inference (CPU time) on core 0, best of 3 runs."""
    inp = exe.parent / "in.bin"
    x.astype("<f4").tofile(inp)
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    best = float("inf")
    for _ in range(3):
        proc = subprocess.run([*pin, str(exe), str(inp), str(exe.parent / "out.bin"), str(repeats)],
                              capture_output=True, text=True, check=True)
        best = min(best, float(re.search(r"([\d.]+) us per inference", proc.stderr).group(1)))  # type: ignore[union-attr]
    return best


def ort_latency(model: Path | bytes, x: np.ndarray, repeats: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    data = model.read_bytes() if isinstance(model, Path) else model
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(min(10, repeats)):
        sess.run(None, feed)
    times = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(repeats):
            sess.run(None, feed)
        times.append((time.process_time() - start) / repeats * 1e6)
    return min(times)


def object_size(directory: Path) -> dict[str, int]:
    c_file = next(p for p in directory.glob("*.c") if p.name != "main.c")
    obj = directory / "size_probe.o"
    subprocess.run(["gcc", "-std=c99", "-O2", "-c", "-o", str(obj), str(c_file)], check=True)
    out = subprocess.run(["size", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines()[1]
    text, data, bss = (int(v) for v in out.split()[:3])
    return {"text": text, "data": data, "bss": bss}


def plans(model: Any) -> dict[str, int]:
    from qcc.backends.c import generate

    from qcc.plan import lb_offsets
    from qcc.plan.memory_plan import PlanOptions, plan_model

    gen = generate(model, "probe")
    lay = gen.layout
    nnb = plan_model(model, PlanOptions(kind="shared"))
    from qcc.plan import nnabla_shared_plan

    return {"arena": lay.plan.total, "lb_off": lb_offsets(list(lay.buffers)), "naive": lay.naive,
            "nnb_qcc": nnb.shared.total if nnb.shared else 0,
            "nnb_nnabla": nnabla_shared_plan(list(nnb.buffers)).total, "nnb_lb_so": nnb.lb_so}


def run(names: list[str], repeats: int) -> list[dict[str, Any]]:
    import qcc.driver

    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for name in names:
            src, calib = model_source(name, tmp)
            float_model, _ = qcc.driver.compile(str(src), tmp / f"{name}_probe")
            x_shape = tuple(d if isinstance(d, int) else 1 for d in float_model.graph.inputs[0].type.shape)
            x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
            fx_calib = calib
            if calib is None:  # zoo models: a small random calibration set
                fx_calib = tmp / f"{name}_calib.npz"
                data = np.random.default_rng(0).standard_normal((4, *x_shape[1:])).astype(np.float32)
                np.savez(fx_calib, **{float_model.graph.inputs[0].name: data})
            schemes = ["none", "fixed16", "fixed8", "int8"] if name == "digits" else ["none", "fixed16", "int8"]
            reps = repeats if name == "digits" else max(3, repeats // 50)
            ort_float = ort_latency(src, x, reps)
            qdq = tmp / f"{name}_qdq.onnx"
            qcc.driver.compile(str(src), qdq, target="onnx-qdq", quantize="int8", calib=str(fx_calib))
            ort_qdq = ort_latency(qdq, x, reps)
            for scheme in schemes:
                out = tmp / f"{name}_{scheme.replace('-', '_')}"
                start = time.perf_counter()
                model, _ = qcc.driver.compile(str(src), out, target="c", quantize=scheme,
                                              calib=None if scheme == "none" else str(fx_calib))
                gen_s = time.perf_counter() - start
                start = time.perf_counter()
                exe = build(out)
                build_s = time.perf_counter() - start
                rows.append({"model": name, "mode": "float32" if scheme == "none" else scheme,
                             "c_us": c_latency(exe, x, reps), "ort_us": ort_float, "ort_qdq_us": ort_qdq,
                             **object_size(out), **plans(model), "gen_s": gen_s, "build_s": build_s,
                             "source_mb": sum(p.stat().st_size for p in out.glob("*.c")) / 1e6})
                print(rows[-1], file=sys.stderr)
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    import onnxruntime

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        HEADING,
        "",
        f"`bench/bench_c.py`, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{subprocess.run(['gcc', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}, "
        f"onnxruntime {onnxruntime.__version__}. C: `-std=c99 -O2`, one core, mean CPU time per inference "
        "(best of 3); ORT: 1 thread, all graph optimizations, same input. QDQ = qcc's `--quantize int8 "
        f"--target onnx-qdq` model in ORT. Load average at the end: {load:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| model | C mode | C (us) | ORT float (us) | ORT QDQ int8 (us) | C / ORT float | C / ORT QDQ | text (B) "
        "| data (B) | arena (B) | LB_off (B) | no reuse (B) | .nnb qcc / nnabla / LB_so (B) | generate + gcc (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['c_us']:.1f} | {r['ort_us']:.1f} | {r['ort_qdq_us']:.1f} "
            f"| {r['c_us'] / r['ort_us']:.2f} | {r['c_us'] / r['ort_qdq_us']:.2f} "
            f"| {r['text']} | {r['data']} | {r['arena']} | {r['lb_off']} | {r['naive']} "
            f"| {r['nnb_qcc']} / {r['nnb_nnabla']} / {r['nnb_lb_so']} | {r['gen_s']:.1f} + {r['build_s']:.1f} |")
    at_bound = sum(r["arena"] == r["lb_off"] for r in rows)
    lines += [
        "",
        f"The arena equals LB_off (the largest sum of live bytes at one step) in {at_bound} of {len(rows)} rows; "
        "a .nnb holds the same tensors in separately allocated buffers, whose sum (LB_so) is at least "
        "LB_off. The C is portable code: GCC -O2 vectorizes only its fixed-length inner loops (SSE2, no "
        "-march), while ORT runs MLAS kernels for this CPU. Fixed point costs more than float here because "
        "nnabla-c-runtime's arithmetic, reproduced bit for bit, truncates and saturates after every input "
        "channel of a convolution; on a microcontroller without a float unit it is the code that runs "
        "at all, in a half (int16) or a quarter (int8) of the float arena and weights. The int8 rows are the "
        "affine mode (`--quantize int8`: scale/zero point, int32 accumulators, one integer requantization per "
        "output), bit-identical to qcc.sim.affine_int.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["digits", "squeezenet", "shufflenet"])
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    section = report(run(args.models, args.repeats))
    print(section)
    if args.record:
        from bench.doc_section import replace_section

        replace_section(HEADING, section, args.record)


if __name__ == "__main__":
    main()
