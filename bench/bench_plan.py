"""Benchmark qcc.plan on synthetic lifetimes: planning time and plan / lower-bound ratios.

    .venv/bin/python bench/bench_plan.py [--sizes 1000 10000 50000] [--record docs/benchmarks.md]

Two families of interval sets, seeded so runs are comparable:
- chain: op i makes tensor i, read by op i+1; 10% are also read 2-11 ops later (residuals);
- dag: op i reads 1-3 tensors from the last 32 (the previous one with p=0.7), so several
  branches are live at once; unread tensors stay live one extra op.
Sizes are log-normal (median ~60 kB) and shrink 4x over the graph, like CNN feature maps.
`--record` replaces (or appends) the "Memory planning algorithms" section of a markdown file.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from qcc.plan import Buffer, naive_size, nnabla_shared_plan, plan_arena, plan_shared

HEADING = "## Memory planning algorithms"


def _sizes(n: int, rng: np.random.Generator) -> np.ndarray:
    shrink = np.linspace(1.0, 0.25, n)
    return (rng.lognormal(11, 1.0, n) * shrink).astype(np.int64) + 1


def chain(n: int, seed: int = 0) -> list[Buffer]:
    rng = np.random.default_rng(seed)
    sizes = _sizes(n, rng)
    reach = np.where(rng.random(n) < 0.1, rng.integers(2, 12, n), 1)
    return [Buffer(f"t{i}", int(sizes[i]), i, i + int(reach[i])) for i in range(n)]


def dag(n: int, seed: int = 0, window: int = 32) -> list[Buffer]:
    rng = np.random.default_rng(seed)
    sizes = _sizes(n, rng)
    last = np.arange(n) + 1  # unread tensors live one extra op
    for i in range(1, n):
        picks = {i - 1} if rng.random() < 0.7 else set()
        for _ in range(int(rng.integers(1, 4)) - len(picks)):
            picks.add(int(rng.integers(max(0, i - window), i)))
        for j in picks:
            last[j] = max(last[j], i)
    return [Buffer(f"t{i}", int(sizes[i]), i, int(last[i])) for i in range(n)]


T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(sizes: list[int]) -> list[str]:
    rows = [
        "| case | buffers | naive | LB_off | arena/LB_off | arena method | arena s "
        "| LB_so | shared/LB_so | shared method | shared s | nnabla/LB_so | nnabla s |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, make in (("chain", chain), ("dag", dag)):
        for n in sizes:
            bufs = make(n)
            a, t_arena = _timed(partial(plan_arena, bufs))
            s, t_shared = _timed(partial(plan_shared, bufs))
            b, t_nn = _timed(partial(nnabla_shared_plan, bufs))
            rows.append(
                f"| {name} | {n} | {naive_size(bufs)} | {a.lower_bound} "
                f"| {a.total / a.lower_bound:.4f} | {a.method} | {t_arena:.2f} "
                f"| {s.lower_bound} | {s.total / s.lower_bound:.4f} | {s.method} | {t_shared:.2f} "
                f"| {b.total / b.lower_bound:.4f} | {t_nn:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


def record(path: Path, rows: list[str]) -> None:
    section = "\n".join(
        [
            HEADING,
            "",
            f"`bench/bench_plan.py` on {platform.machine()}, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}. Synthetic lifetimes (see the script's docstring); "
            "times are wall seconds for one call including the lower bounds; ratios are plan "
            "cost over the lower bound of its kind (1.0000 = provably optimal). "
            f"1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
            "CPUs (other jobs share the machine).",
            "",
            *rows,
            "",
        ]
    )
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--record", type=Path, help="markdown file to update")
    args = parser.parse_args()
    rows = run(args.sizes)
    if args.record:
        record(args.record, rows)


if __name__ == "__main__":
    main()
