"""Import, verify and compile of a 100k-node chain: linear in time, lean in memory (issue 20).

Usage: python bench/bench_big_graph.py [--nodes 100000] [--anchor 10000] [--quantized] [--doc]

Each step runs in a fresh process on an ONNX chain (Relu, Add, Sigmoid, Mul of a [1, 16] tensor,
bench_onnx_import's model) and reports its own wall time (the step only, not Python's start-up)
and the process's peak RSS (VmHWM, start-up included). The anchor is the same chain with
`--anchor` nodes, measured in the same run: the `x` column is time(big) / time(anchor), which is
the node ratio (10) when a step is linear and 100 when it is quadratic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEP = """
import json, sys, time
sys.path.insert(0, {root!r})
import numpy as np
import qcc
from qcc.ir.verify import verify_model
step, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if step == "import":
    qcc.load(model)
elif step == "verify":
    loaded = qcc.load(model)
    start = time.perf_counter()
    assert verify_model(loaded) == []
elif step == "quantized int8 (onnx-qdq)":
    calib = out + ".npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
    start = time.perf_counter()
    qcc.compile(model, out, target="onnx-qdq", quantize="int8", calib=calib)
else:
    qcc.compile(model, out, target=step.split()[-1].strip("()"))
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({{"seconds": seconds, "peak_mb": peak / 1024}}))
"""

STEPS = ("import", "verify", "compile (onnx)", "compile (c)", "compile (nnb)", "compile (nnp)", "import .nnp")


def measure(step: str, model: Path, out: Path) -> dict[str, float]:
    source = model
    if step == "import .nnp":
        source, step = out.with_name("chain.nnp"), "import"
        if not source.exists():
            subprocess.run([sys.executable, "-c", STEP.format(root=str(ROOT)), "compile (nnp)", str(model),
                            str(source)], check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "-c", STEP.format(root=str(ROOT)), step, str(source), str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{step}: {proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run(nodes: int, anchor: int, quantized: bool) -> list[dict[str, object]]:
    from bench.bench_onnx_import import chain_model

    steps = [*STEPS, *(("quantized int8 (onnx-qdq)",) if quantized else ())]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        results: dict[int, dict[str, dict[str, float]]] = {}
        for n in (anchor, nodes):
            folder = Path(tmp) / str(n)
            folder.mkdir()
            model = folder / "chain.onnx"
            model.write_bytes(chain_model(n))
            results[n] = {}
            for step in steps:
                suffix = {"compile (c)": ""}.get(step, ".onnx" if "onnx" in step else f".{step.split()[-1].strip('()')}")
                results[n][step] = measure(step, model, folder / f"out{steps.index(step)}{suffix}")
                print(f"  {n:>7} nodes  {step:<26} {results[n][step]['seconds']:8.2f} s "
                      f"{results[n][step]['peak_mb']:8.0f} MB", flush=True)
        for step in steps:
            a, b = results[anchor][step], results[nodes][step]
            rows.append({"step": step, "anchor_s": a["seconds"], "big_s": b["seconds"],
                         "ratio": b["seconds"] / max(a["seconds"], 1e-9), "anchor_mb": a["peak_mb"],
                         "big_mb": b["peak_mb"], "us_per_node": b["seconds"] / nodes * 1e6,
                         "kb_per_node": (b["peak_mb"] - a["peak_mb"]) * 1024 / (nodes - anchor)})
    return rows


def table(rows: list[dict[str, object]], nodes: int, anchor: int) -> str:
    lines = [f"| step | {anchor // 1000}k nodes (s) | {nodes // 1000}k nodes (s) | x (linear: {nodes / anchor:g}) "
             f"| µs/node | peak RSS {anchor // 1000}k (MB) | peak RSS {nodes // 1000}k (MB) | KB/node |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['anchor_s']:.2f} | {r['big_s']:.2f} | {r['ratio']:.1f} | "
                     f"{r['us_per_node']:.0f} | {r['anchor_mb']:.0f} | {r['big_mb']:.0f} | {r['kb_per_node']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--anchor", type=int, default=10_000)
    parser.add_argument("--quantized", action="store_true", help="also an int8 compile with calibration")
    parser.add_argument("--doc", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    rows = run(args.nodes, args.anchor, args.quantized)
    text = table(rows, args.nodes, args.anchor)
    print(text)
    if args.doc:
        from bench.doc_section import replace_section

        command = "python bench/bench_big_graph.py" + (" --quantized" if args.quantized else "") + " --doc"
        body = (f"## Large graphs\n\n`{command}`, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
                f"{os.cpu_count()} CPUs. Each step in a fresh process on a chain of Relu/Add/Sigmoid/Mul nodes; "
                "seconds are the step's own, peak RSS includes Python and its imports. `x` = time at "
                f"{args.nodes} nodes / time at {args.anchor} (anchor, same run).\n\n" + text)
        replace_section("## Large graphs", body)


if __name__ == "__main__":
    main()
