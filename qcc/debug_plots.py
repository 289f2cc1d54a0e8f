"""PNG plots for debugging a quantized model (`--plots DIR`; matplotlib, the `plots` extra).

- `histograms/<tensor>.png`: each quantized activation's float values on the evaluation data
  (the float model's, so what the quantizer had to cover), the range its type can hold drawn
  as two lines, and the share of values outside it (clipped) in the title;
- `layer_sqnr.png`: every tensor's SQNR against the float model, in graph order (the layer at
  fault is where it drops);
- `memory_timeline.png`: the memory plan, one bar per activation buffer from the step that
  writes it to the step that last reads it, at its offset (arena) or in its shared object.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from qcc.errors import UsageError
from qcc.ir.core import Model, Value
from qcc.ir.types import Affine, FixedPoint

HISTOGRAM_SAMPLES = 256
MAX_HISTOGRAMS = 200


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plots needs matplotlib: pip install 'qcc[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def held_range(value: Value) -> tuple[float, float] | None:
    """The float interval a per-tensor annotation can hold (None: float or per-channel)."""
    quant = value.quant
    if isinstance(quant, FixedPoint):
        top = 2 ** (quant.bits - 1)
        return -top * quant.step, (top - 1) * quant.step
    if isinstance(quant, Affine) and quant.axis is None:
        from qcc.quant import AFFINE_DTYPES

        lo, hi = AFFINE_DTYPES[quant.dtype]
        scale, zp = float(quant.scale[0]), int(quant.zero_point[0])
        return scale * (lo - zp), scale * (hi - zp)
    return None


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120] or "tensor"


def write_plots(reference: Model, compiled: Model, data: Any, source: str, folder: str | os.PathLike[str]) -> list[str]:
    """All three kinds into `folder`; returns the files written."""
    plt = _pyplot()
    out = Path(folder)
    (out / "histograms").mkdir(parents=True, exist_ok=True)
    written = _histograms(plt, reference, compiled, data, source, out / "histograms")
    layers = [{"tensor": v.name, "sqnr_db": v.meta.get("report", {}).get("eval_sqnr_db")}
              for v in compiled.graph.values() if "eval_sqnr_db" in v.meta.get("report", {}) and not v.is_const]
    written.append(sqnr_bar_chart(layers, out, f"{compiled.graph.name}: per-tensor SQNR against the float model"))
    timeline = memory_timeline(plt, compiled, out)
    if timeline:
        written.append(timeline)
    return written


def _histograms(plt: Any, reference: Model, compiled: Model, data: Any, source: str, out: Path) -> list[str]:
    """Float values of the first samples, one figure per quantized activation."""
    from qcc.data import DataStream, bind_inputs, static_batch
    from qcc.ir.samples import to_model
    from qcc.sim.interpreter import Interpreter

    arrays = data.take(HISTOGRAM_SAMPLES, reference) if isinstance(data, DataStream) else data
    feeds, _ = bind_inputs(reference, arrays, source)
    quantized = {v.name: v for v in compiled.graph.values() if not v.is_const and held_range(v) is not None}
    wanted = dict(list(quantized.items())[:MAX_HISTOGRAMS])
    seen: dict[str, list[np.ndarray]] = {}

    def keep(value: Value, array: np.ndarray) -> None:
        if value.name in wanted:
            seen.setdefault(value.name, []).append(np.asarray(array, np.float32).reshape(-1))

    runner = Interpreter(reference, observer=keep)
    count = len(next(iter(feeds.values())))
    size = static_batch(reference, source) or 32
    for start in range(0, min(count, HISTOGRAM_SAMPLES) - size + 1, size):
        runner.run(to_model(reference, {k: v[start:start + size] for k, v in feeds.items()}))
    files = []
    for name, parts in seen.items():
        values = np.concatenate(parts)
        rng = held_range(wanted[name])
        assert rng is not None
        clipped = float(np.mean((values < rng[0]) | (values > rng[1])))
        counts, edges = np.histogram(values, bins=128)
        fig = plt.figure(figsize=(6, 3))
        ax = fig.add_axes((0.12, 0.17, 0.85, 0.68))  # fixed margins: tight_layout costs 0.5 s a figure
        ax.stairs(np.log10(counts + 1.0), edges, fill=True, color="#4878a8")
        for edge in rng:
            ax.axvline(edge, color="#c03030", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: {wanted[name].quant}\nrange [{rng[0]:.4g}, {rng[1]:.4g}], clipped {100 * clipped:.3f}%",
                     fontsize=8)
        ax.set_xlabel("float value (float model, evaluation data)", fontsize=8)
        ax.set_ylabel("log10(count + 1)", fontsize=8)
        path = out / f"{_file_name(name)}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        files.append(str(path))
    return files


def sqnr_bar_chart(layers: list[dict[str, Any]], folder: str | os.PathLike[str], title: str) -> str:
    """One bar per tensor (graph order); 'exact' (no error) is drawn at the top of the scale."""
    plt = _pyplot()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    names = [e["tensor"] for e in layers]
    finite = [e["sqnr_db"] for e in layers if e["sqnr_db"] is not None]
    top = max(finite, default=60.0) + 10.0
    values = [top if e["sqnr_db"] is None else e["sqnr_db"] for e in layers]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(names) + 2), 4))
    ax.bar(range(len(names)), values, color=["#999999" if e["sqnr_db"] is None else "#4878a8" for e in layers])
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=6)
    ax.set_ylabel("SQNR dB (grey: exact)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path = out / "layer_sqnr.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


def memory_timeline(plt: Any, model: Model, folder: Path) -> str | None:
    """The stored memory plan as bars: x = execution steps alive, y = offset (or shared object)."""
    from qcc.plan.memory_plan import MemoryPlan

    plan = model.products.get(MemoryPlan)
    if plan is None or not plan.buffers:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if plan.arena is not None:
        for b in plan.buffers:
            offset = plan.arena.offsets.get(b.name, 0)
            ax.broken_barh([(b.first, b.last - b.first + 1)], (offset, b.size), facecolor="#4878a8", edgecolor="k",
                           linewidth=0.3)
        ax.set_ylabel(f"arena offset (bytes; total {plan.arena.total})")
    elif plan.shared is not None:
        base = np.concatenate([[0], np.cumsum(plan.shared.buffer_sizes)])
        for b in plan.buffers:
            obj = plan.shared.assignment[b.name]
            ax.broken_barh([(b.first, b.last - b.first + 1)], (base[obj], b.size), facecolor="#4878a8",
                           edgecolor="k", linewidth=0.3)
        ax.set_ylabel(f"shared objects, stacked (bytes; total {plan.shared.total})")
    ax.set_xlabel("execution step")
    ax.set_title(f"{model.graph.name}: memory plan ({len(plan.buffers)} activation buffers)", fontsize=8)
    fig.tight_layout()
    path = folder / "memory_timeline.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)
