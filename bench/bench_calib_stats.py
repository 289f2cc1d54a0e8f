"""Calibration statistics: qcc's streaming histogram vs ONNX Runtime's HistogramCollector.

Both sides get the same float32 arrays, one batch at a time. ORT is measured through the
collector its HistogramCalibrater uses (the session run is the same for both and left out):
'streaming' calls collect() per batch; 'as collect_data' passes every batch at once, which is
what HistogramCalibrater.collect_data does with a whole data reader (and why its memory grows).
Also timed: turning the statistics into a range, and peak memory of the collection.

Run: .venv/bin/python bench/bench_calib_stats.py [--batches 16] [--batch-mb 4] [--no-write]
Results are printed and written to docs/benchmarks.md under "## Calibration statistics".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from qcc.quant import TensorStats, entropy, mse, percentile

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "## Calibration statistics"
T = TypeVar("T")


def _data(kind: str, batches: int, elems: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batches):
        x = rng.standard_normal(elems).astype(np.float32) * np.float32(1 + 0.1 * i)
        if kind == "relu":
            np.maximum(x, 0, out=x)
        else:  # heavy tails: a few large values, the range keeps growing
            x[rng.integers(0, elems, 8)] *= np.float32(30 + i)
        out.append(x.reshape(-1, 1024))
    return out


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _quiet(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        with contextlib.redirect_stdout(io.StringIO()):  # ORT prints progress
            return fn()

    return run


def _qcc_collect(data: list[np.ndarray]) -> TensorStats:
    s = TensorStats("t")
    for x in data:
        s.update(x)
    return s


def _ort_collector(method: str, num_bins: int = 2048) -> Any:
    from onnxruntime.quantization.calibrate import HistogramCollector

    symmetric = method == "percentile"
    return HistogramCollector(method, symmetric, num_bins, 128, 99.99, "same")


def _ort_streaming(method: str, data: list[np.ndarray]) -> Any:
    col = _ort_collector(method)
    for x in data:
        col.collect({"t": x})
    return col


def _ort_at_once(method: str, data: list[np.ndarray]) -> Any:
    col = _ort_collector(method)
    col.collect({"t": list(data)})
    return col


def _peak_mb(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def _collection_rows(data: list[np.ndarray], repeat: int) -> list[tuple[str, float]]:
    rows = [("qcc TensorStats.update (streaming)", _best(partial(_qcc_collect, data), repeat))]
    for method, label in (("entropy", "signed, entropy"), ("percentile", "abs(x), percentile")):
        for mode, fn in (("streaming", _ort_streaming), ("as collect_data", _ort_at_once)):
            t = _best(_quiet(partial(fn, method, data)), repeat)
            rows.append((f"ORT HistogramCollector {label}, {mode}", t))
    return rows


def _range_rows(data: list[np.ndarray], repeat: int) -> list[tuple[str, float]]:
    stats = _qcc_collect(data)
    ent_col = _quiet(partial(_ort_at_once, "entropy", data))()
    pct_col = _quiet(partial(_ort_at_once, "percentile", data))()
    return [
        ("qcc entropy (2048 bins/sign, 128 target)", _best(partial(entropy, stats), repeat)),
        ("qcc percentile 99.99", _best(partial(percentile, stats, 99.99), repeat)),
        ("qcc mse int8 (128 candidates)", _best(partial(mse, stats), repeat)),
        (
            "ORT entropy (2048 bins, 128 target)",
            _best(_quiet(ent_col.compute_collection_result), 1),
        ),
        (
            "ORT percentile 99.99 (2048 bins)",
            _best(_quiet(pct_col.compute_collection_result), repeat),
        ),
    ]


def run(batches: int, batch_mb: float, repeat: int) -> list[str]:
    elems = int(batch_mb * 1e6 / 4) // 1024 * 1024
    _ort_collector("entropy")  # import onnxruntime outside the timings
    lines = []
    for kind in ("relu", "heavy"):
        data = _data(kind, batches, elems)
        mb = sum(x.nbytes for x in data) / 1e6
        rows = _collection_rows(data, repeat)
        t_qcc = rows[0][1]
        lines.append(
            f"\n{kind} activations: {batches} batches x {elems * 4 / 1e6:.1f} MB ({mb:.0f} MB)\n"
        )
        lines.append("| collection | time (s) | MB/s | qcc speed-up |")
        lines.append("|---|---:|---:|---:|")
        lines.extend(
            f"| {label} | {t:.3f} | {mb / t:.0f} | {t / t_qcc:.1f}x |" for label, t in rows
        )
        lines.append("\n| range from statistics | time (ms) |")
        lines.append("|---|---:|")
        lines.extend(f"| {label} | {t * 1e3:.1f} |" for label, t in _range_rows(data, repeat))
        qcc_peak = _peak_mb(partial(_qcc_collect, data))
        ort_peak = _peak_mb(_quiet(partial(_ort_at_once, "percentile", data)))
        size_kb = _qcc_collect(data[:1]).nbytes() / 1e3
        lines.append("\n| peak traced memory during collection | MB |")
        lines.append("|---|---:|")
        lines.append(f"| qcc streaming (stats object: {size_kb:.0f} kB) | {qcc_peak:.1f} |")
        lines.append(f"| ORT percentile, as collect_data | {ort_peak:.1f} |")
    return lines


def write_section(lines: list[str]) -> None:
    head = [
        SECTION,
        "",
        f"`bench/bench_calib_stats.py`, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"numpy {np.__version__}, onnxruntime {_ort_version()}. Same float32 arrays on both sides;",
        "ORT timed through HistogramCollector (what HistogramCalibrater calls), session excluded.",
        f"Best of the repeats; 1-minute load average at the end: {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs (other jobs share the machine, so absolute MB/s vary).",
    ]
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.doc_section import replace_section

    replace_section(SECTION, "\n".join(head + lines) + "\n", DOC)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--batch-mb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    lines = run(args.batches, args.batch_mb, args.repeat)
    print("\n".join(lines))
    if not args.no_write:
        write_section(lines)
        print(f"\nwritten to {DOC}")


if __name__ == "__main__":
    main()
