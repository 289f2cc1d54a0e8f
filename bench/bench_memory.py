"""Memory planning on real models: plans against the bounds and nnabla's policy, aliasing,
reordering, and planning time on synthetic graphs of 1k-50k nodes.

    .venv/bin/python bench/bench_memory.py [--sizes 1000 5000 10000 50000] [--record docs/benchmarks.md]

Models: the nine onnx light zoo graphs, the seed 003 ResNet23 (3x32x32), MobileNet v1/v2 (224,
built with onnx.helper: tests/memory_models.py) and GoogLeNet's inception modules without the
stem. Sizes: float32 and FIXED8 (`--quantize fixed8` sizing: one byte per element). Default plan
options except alignment 1, so ratios compare with the exact bounds. `--record` replaces (or
appends) the "Memory planning on models" section of a markdown file.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qcc.ir import Graph, Model, TensorType
from qcc.plan import nnabla_shared_plan
from qcc.plan.liveness import StorageOptions, compute_storage
from qcc.plan.memory_plan import MemoryPlan, PlanOptions, plan_model
from qcc.plan.reorder import best_schedule

HEADING = "## Memory planning on models"


def models() -> list[tuple[str, Model]]:
    from tests import memory_models as mm
    from tests.onnx_zoo import LIGHT_NAMES, light_path

    out = [(name, mm.load(light_path(name).read_bytes(), name)) for name in LIGHT_NAMES]
    out += [("resnet23 (seed 003)", mm.load(mm.resnet23(), "resnet23")),
            ("mobilenet_v1", mm.load(mm.mobilenet_v1(), "mobilenet_v1")),
            ("mobilenet_v2", mm.load(mm.mobilenet_v2(), "mobilenet_v2")),
            ("inception 3a-4a", mm.load(mm.inception_stack(), "inception_stack"))]
    return out


def _plan(model: Model, scheme: str, sharing: bool) -> tuple[MemoryPlan, float]:
    """The plan and the best of three planning times (the machine is shared)."""
    options = PlanOptions(alignment=1, aliases=sharing, inplace=sharing, scheme=scheme)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        plan = plan_model(model, options)
        times.append(time.perf_counter() - start)
    return plan, min(times)


def _r(x: float) -> str:
    return f"{x:.4f}"


def plan_rows(zoo: list[tuple[str, Model]]) -> list[str]:
    rows = ["| model | sizes | buffers | naive | LB_off | arena | arena/LB_off | LB_so | shared | shared/LB_so "
            "| shared proved optimal | nnabla policy | nnabla/qcc | plan s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, model in zoo:
        for scheme in ("", "fixed8"):
            plan, seconds = _plan(model, scheme, False)
            assert plan.arena is not None and plan.shared is not None
            nnabla = nnabla_shared_plan(plan.buffers)
            rows.append(f"| {name} | {scheme or 'float32'} | {len(plan.buffers)} | {plan.naive_bytes} | {plan.lb_off} "
                        f"| {plan.arena.total} | {_r(plan.arena.total / plan.lb_off)} | {plan.lb_so} "
                        f"| {plan.shared.total} | {_r(plan.shared.total / plan.lb_so)} "
                        f"| {'yes' if plan.shared_optimal else 'no'} | {nnabla.total} "
                        f"| {_r(nnabla.total / plan.shared.total)} | {seconds:.3f} |")
            print(rows[-1], flush=True)
    return rows


def sharing_rows(zoo: list[tuple[str, Model]]) -> list[str]:
    rows = ["| model | LB_off plain | LB_off aliased | arena aliased | arena aliased / LB_off plain "
            "| LB_so aliased | shared aliased | shared/LB_so | proved optimal | nnabla policy aliased | nnabla/qcc |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name, model in zoo:
        plain, _ = _plan(model, "", False)
        both, _ = _plan(model, "", True)
        assert both.arena is not None and both.shared is not None
        nnabla = nnabla_shared_plan(both.buffers)
        rows.append(f"| {name} | {plain.lb_off} | {both.lb_off} | {both.arena.total} "
                    f"| {_r(both.arena.total / plain.lb_off)} | {both.lb_so} | {both.shared.total} "
                    f"| {_r(both.shared.total / both.lb_so)} | {'yes' if both.shared_optimal else 'no'} "
                    f"| {nnabla.total} | {_r(nnabla.total / both.shared.total)} |")
        print(rows[-1], flush=True)
    return rows


def level_order(model: Model) -> Model:
    """The same graph in breadth-first (level) order, as some exporters write it."""
    depth: dict[int, int] = {}
    for node in model.graph.nodes:
        depth[id(node)] = max([depth[id(v.producer())] + 1 for v in node.inputs
                               if v is not None and v.producer() is not None] + [0])
    model.graph.nodes = sorted(model.graph.nodes, key=lambda n: depth[id(n)])
    return model


def reorder_rows(zoo: list[tuple[str, Model]]) -> list[str]:
    rows = ["| model | order | LB_off before | after | after/before | footprint bound | method | s |",
            "|---|---|---:|---:|---:|---:|---|---:|"]
    cases = [(name, "as given", model) for name, model in zoo]
    from tests import memory_models as mm

    for name in ("inception_v1", "squeezenet", "shufflenet"):
        from tests.onnx_zoo import light_path

        cases.append((name, "level order", level_order(mm.load(light_path(name).read_bytes(), name))))
    cases.append(("inception 3a-4a", "level order", level_order(mm.load(mm.inception_stack(), "inc"))))
    for seed in range(3):
        cases.append((f"random branchy DAG {seed}", "as built", branchy(400, seed)))
    for name, order, model in cases:
        start = time.perf_counter()
        s = best_schedule(model.graph, StorageOptions(), time_budget=1.0)
        seconds = time.perf_counter() - start
        rows.append(f"| {name} | {order} | {s.original_peak} | {s.peak} | {_r(s.peak / s.original_peak)} "
                    f"| {s.bound} | {s.method} | {seconds:.2f} |")
        print(rows[-1], flush=True)
    return rows


def branchy(n: int, seed: int, window: int = 24) -> Model:
    """About n ops on (1, C, 8, 8) tensors: 1x1 convs with random widths, residual adds,
    concats and ReLUs, each reading recent tensors (several branches live at once); ops no
    output depends on are dropped (about 60% of those drawn, so 2.5 n are drawn)."""
    rng = np.random.default_rng(seed)
    g = Graph(f"branchy{n}")
    values = [g.add_input("x", TensorType("float32", (1, 8, 8, 8)))]
    w_cache: dict[tuple[int, int], object] = {}
    for i in range(5 * n // 2):
        a = values[-1] if rng.random() < 0.5 else values[int(rng.integers(max(0, len(values) - window), len(values)))]
        c = int(a.type.shape[1])
        kind = rng.choice(["conv", "relu", "add", "concat"], p=[0.45, 0.25, 0.15, 0.15])
        b = values[int(rng.integers(max(0, len(values) - window), len(values)))]
        if kind == "concat" and c + int(b.type.shape[1]) > 128:
            kind = "conv"
        if kind == "conv":
            cout = int(rng.choice([4, 8, 16, 32, 64]))
            key = (cout, c)
            if key not in w_cache:
                w_cache[key] = g.add_constant(f"w{cout}x{c}", rng.standard_normal((cout, c, 1, 1)).astype(np.float32))
            out = g.add("Conv", a, w_cache[key], name=f"conv{i}")  # type: ignore[arg-type]
        elif kind == "add":
            same = [v for v in values[-window:] if v.type == a.type]
            out = g.add("Add", a, same[int(rng.integers(len(same)))], name=f"add{i}")
        elif kind == "concat":
            out = g.add("Concat", a, b, axis=1, name=f"cat{i}")
        else:
            out = g.add("Relu", a, name=f"relu{i}")
        values.append(out)
    g.outputs = [values[-1]]
    g.cleanup()
    return Model(g)


def scaling_rows(sizes: list[int]) -> list[str]:
    rows = ["| synthetic graph | nodes | buffers | liveness s | plan s, heuristics only | arena/LB_off "
            "| shared/LB_so | plan s, with searches (1 s budgets) | arena/LB_off | shared/LB_so "
            "| s per 1k nodes (liveness + heuristics) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        model = branchy(n, 0)
        start = time.perf_counter()
        storage = compute_storage(model.graph)
        t_live = time.perf_counter() - start
        cells: list[str] = []
        seconds: list[float] = []
        for budget in (0.0, 1.0):
            start = time.perf_counter()
            plan = plan_model(model, PlanOptions(alignment=1, time_budget=budget), storage)
            seconds.append(time.perf_counter() - start)
            assert plan.arena is not None and plan.shared is not None
            cells += [f"{seconds[-1]:.2f}", _r(plan.arena.total / plan.lb_off), _r(plan.shared.total / plan.lb_so)]
        nodes = len(model.graph.nodes)
        rows.append(f"| branchy | {nodes} | {len(plan.buffers)} | {t_live:.2f} | {' | '.join(cells)} "
                    f"| {1000 * (t_live + seconds[0]) / nodes:.3f} |")
        print(rows[-1], flush=True)
    return rows


def record(path: Path, tables: list[tuple[str, list[str]]]) -> None:
    lines = [HEADING, "",
             f"`bench/bench_memory.py` on {platform.machine()}, Python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d')}; 1-minute load average at the end "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs share the machine, so times vary). "
             "Bytes; plan s = best of three; plans with alignment 1 so ratios compare with the exact bounds (1.0000 = provably "
             "optimal); `shared proved optimal`: the shared-object search proved no plan is cheaper, "
             "including where LB_so itself is unreachable. nnabla/qcc = nnabla's policy "
             "(save_variable_buffer.py, reimplemented) over qcc's shared-object total on the same lifetimes.",
             ""]
    for title, rows in tables:
        lines += [f"**{title}**", "", *rows, ""]
    from bench.doc_section import replace_section

    replace_section(HEADING, "\n".join(lines), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000, 50000])
    parser.add_argument("--record", type=Path, help="markdown file to update")
    args = parser.parse_args()
    zoo = models()
    tables = [
        ("Plans without sharing, float32 and FIXED8 sizes", plan_rows(zoo)),
        ("View aliases + in-place elementwise ops (float32)", sharing_rows(zoo)),
        ("Reordering (no sharing, float32)", reorder_rows(zoo)),
        ("Planning time on synthetic graphs (liveness + both plans)", scaling_rows(args.sizes)),
    ]
    if args.record:
        record(args.record, tables)


if __name__ == "__main__":
    main()
