"""qcc.quant.numerics.clamp (rows of the bound) against numpy's scalar paths it replaces, measured in
the same run on the same arrays.

numpy 1.26 compares an array with a scalar in a slower loop than with an array of the same layout;
clamp compares C-contiguous data a row at a time with a cached row of the bound (the same bits:
tests/test_clamp.py). Cases: a ReLU6 (Clip 0..6) on a MobileNetV2 96x96 expansion output of 4
samples (4, 96, 48, 48), a Relu on the same, and fake quantization's int8 clip (of x * 40: the
product is in all three columns of that row). Best of --repeats, the variants interleaved.

Run: .venv/bin/python bench/bench_clamp.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_fixed_conv import best
from qcc.quant.numerics import clamp


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    x = (np.random.default_rng(0).standard_normal((4, 96, 48, 48)) * 4).astype(np.float32)
    f32 = np.float32
    cases: dict[str, tuple[Callable[[], object], Callable[[], object], Callable[[], object]]] = {
        "ReLU6 (Clip 0..6)": (lambda: np.clip(x, f32(0), f32(6)),
                              lambda: np.minimum(np.maximum(x, f32(0)), f32(6)),
                              lambda: clamp(x, f32(0), f32(6))),
        "Relu": (lambda: np.clip(x, f32(0), None), lambda: np.maximum(x, 0), lambda: clamp(x, 0.0, None)),
        "int8 clip (fake quantization)": (lambda: np.clip(x * 40, -128, 127),
                                          lambda: np.minimum(np.maximum(x * 40, f32(-128)), f32(127)),
                                          lambda: clamp(x * 40, -128, 127)),
    }
    print(f"| case, {x.shape} float32 | np.clip (ms) | np.maximum/np.minimum, scalars (ms) | clamp (ms) | "
          "clamp vs np.clip |")
    print("|---|---:|---:|---:|---:|")
    for label, (clip, scalars, rows) in cases.items():
        for a, b in ((clip(), rows()), (scalars(), rows())):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        t = {name: float("inf") for name in ("clip", "scalars", "rows")}
        for _ in range(3):  # interleaved rounds: drift hits all alike
            for name, fn in (("clip", clip), ("scalars", scalars), ("rows", rows)):
                t[name] = min(t[name], best(fn, args.repeats // 3 or 1))
        print(f"| {label} | {1000 * t['clip']:.3f} | {1000 * t['scalars']:.3f} | {1000 * t['rows']:.3f} | "
              f"{t['clip'] / t['rows']:.1f}x |")


if __name__ == "__main__":
    main()
