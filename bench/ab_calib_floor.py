"""Calibration floor, this checkout against another one, interleaved in one run (issue 19).

The machine is shared, so absolute times drift; what holds is the ratio within one repetition.
Each repetition runs, as fresh processes in turn, one plain ONNX Runtime float pass and
`bench_calib_scale.py --floor-worker MODE` of the other checkout and of this one (the same
model file and samples), so both checkouts' ratios to the ORT pass and to each other are
same-run. The other checkout is a plain tree (e.g. `git archive <commit> | tar -x -C DIR`) with
`DIR/qcc/passes -> ../passes` and `DIR/qcc/backends -> ../backends` symlinks, so its own
`passes/` is imported rather than this editable install's.

Run: .venv/bin/python bench/ab_calib_floor.py --base DIR [--models resnet50,densenet121]
     [--modes qcc+fold] [--repeat 5] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def worker(root: Path, mode: str, path: Path, samples: int) -> dict[str, float]:
    script = root / "bench" / "bench_calib_scale.py"
    proc = subprocess.run([sys.executable, str(script), "--floor-worker", mode, str(path), str(samples)],
                          capture_output=True, text=True, cwd=root, check=True)
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    from compare_ort_quant import light_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--models", default="resnet50,densenet121")
    ap.add_argument("--modes", default="qcc+fold")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| model | run | wall s | CPU s | wall / ORT pass | CPU / ORT pass | wall / base (same rep.) | CPU / base |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = Path(tmp) / f"light_{name}.onnx"
            light_model(name, path)
            runs: dict[str, list[dict[str, float]]] = {}
            for _ in range(args.repeat):
                runs.setdefault("ORT float pass", []).append(worker(ROOT, "ort-pass", path, args.samples))
                for mode in args.modes.split(","):
                    runs.setdefault(f"base {mode}", []).append(worker(args.base, mode, path, args.samples))
                    runs.setdefault(f"this {mode}", []).append(worker(ROOT, mode, path, args.samples))
            ort = runs["ORT float pass"]
            for label, got in runs.items():
                base = runs.get(label.replace("this ", "base "), got)
                row = [name, label, med([r["wall"] for r in got]), med([r["cpu"] for r in got]),
                       med([r["wall"] / o["wall"] for r, o in zip(got, ort)]),
                       med([r["cpu"] / o["cpu"] for r, o in zip(got, ort)]),
                       med([r["wall"] / b["wall"] for r, b in zip(got, base)]),
                       med([r["cpu"] / b["cpu"] for r, b in zip(got, base)])]
                print("| " + " | ".join(row) + " |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
