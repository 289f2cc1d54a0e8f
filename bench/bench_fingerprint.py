"""passes/float_reference.fingerprint (sha256 of the wiring and of each constant's CRC-32) against the
sha256 of every constant's bytes it replaced, on torchvision's mobilenet_v2 (random weights, 3.5M
float32 parameters, BatchNorm folded as the default pipelines fold it), in the same run.

A compile with bias-correct computes it twice (calibrate keeps its float outputs, bias-correct
checks they are for this very model). Best of --repeats, the two interleaved.

Run: .venv/bin/python bench/bench_fingerprint.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qcc.passes.float_reference import fingerprint


def bytes_fingerprint(model: object) -> bytes:
    """The previous fingerprint: sha256 over the wiring and every constant's bytes."""
    digest = hashlib.sha256()
    graph = model.graph  # type: ignore[attr-defined]
    for node in graph.nodes:
        names = [v.name if v is not None else "" for v in (*node.inputs, *node.outputs)]
        digest.update(f"{node.op}|{node.name}|{','.join(names)};".encode())
    for value in graph.constants:
        data = np.ascontiguousarray(value.const)
        digest.update(f"{value.name}|{data.dtype}|{data.shape};".encode())
        digest.update(data.reshape(-1).data)
    return digest.digest()


def main() -> None:
    import torch
    import torchvision

    from qcc.api import write
    from qcc.driver import load
    from qcc.pm import PassManager

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v2(weights=None).eval()
    program = torch.export.export(net, (torch.zeros(1, 3, 96, 96),))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mobilenet_v2.onnx"
        write(load(program, input_names=["x"]), path, target="onnx")
        model = load(str(path))
    PassManager("fold-bn").run(model)
    weights = sum(int(v.const.size) for v in model.graph.constants if v.const is not None)
    old = new = float("inf")
    for _ in range(args.repeats):
        for which in ("old", "new"):
            start = time.perf_counter()
            (bytes_fingerprint if which == "old" else fingerprint)(model)
            seconds = time.perf_counter() - start
            old, new = (min(old, seconds), new) if which == "old" else (old, min(new, seconds))
    print("| model | constants' values | sha256 of the bytes (ms) | CRC-32 per constant (ms) | speed-up |")
    print("|---|---:|---:|---:|---:|")
    print(f"| torchvision mobilenet_v2, BN folded | {weights} | {1000 * old:.1f} | {1000 * new:.1f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
