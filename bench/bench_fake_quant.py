"""Affine fake quantization (qcc.quant.numerics.fake_quant_affine) against the integer round trip
it replaces (quantize_affine then dequantize_affine), measured in the same run.

Every quantized simulation (bias correction, sensitivity, --eval of a QDQ model) applies it to
each stored activation. The two give the same bits (tests/test_quant_stats.py); this prints what
the float32 in-place path saves: per tensor (uint8, one scale) and per channel (int8 weights-like,
axis 1), on a ResNet-50 stage-1 activation of 16 samples (16, 64, 56, 56). Best of --repeats,
the two interleaved.

Run: .venv/bin/python bench/bench_fake_quant.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qcc.quant.numerics import dequantize_affine, fake_quant_affine, quantize_affine


def integer_round_trip(x: np.ndarray, scale: object, zp: object, dtype: str, axis: int | None) -> np.ndarray:
    return dequantize_affine(quantize_affine(x, scale, zp, dtype, axis), scale, zp, axis)  # type: ignore[arg-type]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((16, 64, 56, 56)).astype(np.float32)
    cases = {"per tensor, uint8": (np.float32(0.05), 3, "uint8", None),
             "per channel, int8": (np.linspace(0.01, 0.1, 64, dtype=np.float32), np.zeros(64, np.int64), "int8", 1)}
    print("| case | integer round trip (ms) | fake_quant_affine (ms) | speed-up |")
    print("|---|---:|---:|---:|")
    for label, (scale, zp, dtype, axis) in cases.items():
        old = new = float("inf")
        for _ in range(args.repeats):  # interleaved: drift hits both alike
            old = min(old, timed(lambda: integer_round_trip(x, scale, zp, dtype, axis)))
            new = min(new, timed(lambda: fake_quant_affine(x, scale, zp, dtype, axis)))
        print(f"| {label} | {1000 * old:.1f} | {1000 * new:.1f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
