"""Calibration passes end to end: qcc vs onnxruntime.quantization.quantize_static, 100 vs 1000 samples.

Model: the onnx package's light SqueezeNet with seeded random weights (tests/onnx_zoo.py), input
(1, 3, 224, 224), so both tools feed one sample per batch. Data: standard-normal samples, the
same seed on both sides. Each configuration runs in a fresh subprocess under an address-space
cap (--cap-gb) and reports wall time and peak RSS (VmHWM); "growth" is the peak minus the RSS
once the model is loaded and the data generated, i.e. what calibrating costs beyond holding the
data (1000 samples are 602 MB).

- qcc: `calibrate,quantize-affine` (streaming 2048-bin histograms for every activation, then
  int8 ranges), the model run by the reference numpy interpreter, or by onnxruntime
  (`calibrate{engine=onnxruntime}`: the IR exported with every activation as an output).
- ORT: quantize_static (QDQ, per tensor) with a reader yielding one sample at a time. MinMax
  adds ReduceMin/ReduceMax outputs to the graph and keeps two scalars per tensor and sample;
  Entropy (HistogramCalibrater, the histogram method comparable to qcc's statistics) keeps every
  intermediate output of every sample until the reader ends (onnxruntime #10503, #11020,
  #21979; CalibMaxIntermediateOutputs only applies to MinMax).

Both tools get the model as ORT's quant_pre_process leaves it (run once, not timed).

Run: .venv/bin/python bench/bench_calibrate.py [--samples 100,1000] [--cap-gb 6] [--no-write]
Results are printed and written to docs/benchmarks.md under "## Calibration passes".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Calibration passes"
TOOLS = {
    "qcc": "qcc calibrate + quantize-affine",
    "qcc-ort": "qcc calibrate{engine=onnxruntime} + quantize-affine",
    "ort-minmax": "ORT quantize_static, MinMax",
    "ort-entropy": "ORT quantize_static, Entropy",
}


def _status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak of this process image: ru_maxrss would include the parent's
    peak, Linux keeps it across fork and exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _data(model_path: str, n: int) -> dict[str, np.ndarray]:
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    inp = next(i for i in graph.input if i.name not in inits)
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    return {inp.name: rng.standard_normal((n, *shape[1:]), dtype=np.float32)}


def worker(tool: str, model_path: str, n: int, cap_gb: float) -> dict[str, Any]:
    cap = int(cap_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    data = _data(model_path, n)
    if tool.startswith("qcc"):
        from qcc.driver import load
        from qcc.pm import PassContext, PassManager

        model = load(model_path)
        base = _status_mb("VmRSS")
        start = time.perf_counter()
        engine = "onnxruntime" if tool == "qcc-ort" else "qcc"
        PassManager(f"calibrate{{engine={engine}}},quantize-affine").run(model, PassContext(calib_data=data))
    else:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            quantize_static,
        )

        class Reader(CalibrationDataReader):  # type: ignore[misc]
            def __init__(self) -> None:
                self.i = 0

            def get_next(self) -> dict[str, np.ndarray] | None:
                if self.i >= n:
                    return None
                self.i += 1
                return {k: v[self.i - 1:self.i] for k, v in data.items()}

        method = CalibrationMethod.Entropy if tool == "ort-entropy" else CalibrationMethod.MinMax
        base = _status_mb("VmRSS")
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            quantize_static(model_path, str(Path(tmp) / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=False, calibrate_method=method)
    seconds = time.perf_counter() - start
    peak = _status_mb("VmHWM")
    return {"seconds": seconds, "peak_mb": peak, "base_mb": base}


def run_one(tool: str, model_path: str, n: int, cap_gb: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", tool, "--model", model_path, "--n", str(n), "--cap-gb", str(cap_gb)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        return {"error": f"failed: {tail[:100]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _opset13(data: bytes) -> bytes:
    """The zoo's opset-9/IR-3 graph as opset 13 (ORT's quantizer needs >= 11 and its converter
    fails on IR 3 graphs whose weights are not graph inputs): the same model for both tools."""
    import onnx

    model = onnx.load_from_string(data)
    inits = {t.name for t in model.graph.initializer}
    real = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(real)
    model.ir_version = 7
    model = onnx.version_converter.convert_version(model, 13)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def run(samples: list[int], cap_gb: float) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.onnx_zoo import randomized_bytes

    lines = ["| tool | samples | time (s) | ms/sample | peak RSS (MB) | growth over data (MB) |",
             "|---|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        from onnxruntime.quantization import quant_pre_process

        source = str(Path(tmp) / "squeezenet.onnx")
        Path(source).write_bytes(_opset13(randomized_bytes("squeezenet")))
        model_path = str(Path(tmp) / "prepared.onnx")  # ORT's documented first step, for both tools
        quant_pre_process(source, model_path, skip_symbolic_shape=True)
        for tool, label in TOOLS.items():
            for n in samples:
                r = run_one(tool, model_path, n, cap_gb)
                if "error" in r:
                    lines.append(f"| {label} | {n} | {r['error']} | | | |")
                else:
                    lines.append(f"| {label} | {n} | {r['seconds']:.1f} | {1000 * r['seconds'] / n:.0f} | "
                                 f"{r['peak_mb']:.0f} | {r['peak_mb'] - r['base_mb']:.0f} |")
                print(lines[-1], flush=True)
    return lines


def write_section(lines: list[str], cap_gb: float) -> None:
    import onnxruntime

    head = [SECTION, "",
            f"`bench/bench_calibrate.py`, {datetime.date.today()}, {platform.machine()}, numpy {np.__version__}, "
            f"onnxruntime {onnxruntime.__version__}. light SqueezeNet (random weights, input 1x3x224x224, 26 Conv), "
            "standard-normal samples fed one at a time;",
            f"each row a fresh process under a {cap_gb:g} GB address-space cap. 1-minute load average at the end: "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs share the machine).", ""]
    sys.path.insert(0, str(ROOT))
    from bench.doc_section import replace_section

    replace_section(SECTION, "\n".join(head + lines) + "\n", DOC)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="100,1000")
    ap.add_argument("--cap-gb", type=float, default=12.0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--worker", choices=sorted(TOOLS), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.n, args.cap_gb)))
        return
    lines = run([int(s) for s in args.samples.split(",")], args.cap_gb)
    if not args.no_write:
        write_section(lines, args.cap_gb)
        print(f"written to {DOC}")


if __name__ == "__main__":
    main()
