"""The simulators' shared run loop (qcc.sim.engine.Runner): what it costs per node beyond the kernels.

Anchor, measured in the same run: the same kernels called in graph order by the barest loop
(arguments from a dict, no storage hooks, no observer, nothing freed). Models: a chain of 400
Relu on 4 floats (the loop dominates) and the digits CNN at batch 1 (a real model, kernels
dominate), run by the float interpreter (with a no-op observer, as calibration runs it) and, for
digits annotated fixed8, by the fixed-point runner (no observer: an observer of an integer runner
also pays for reading every value back as float). Each figure is the best of --repeats rounds, the
runner's and the anchor's interleaved.

For the interpreter, the loop it had before the shared engine (a copy, `previous_loop`) is timed
against the same anchor: the ratios compare the two loops on the same kernels.

Run: .venv/bin/python bench/bench_sim_loop.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qcc.ir.core import Graph, Model, Value  # noqa: E402
from qcc.ir.types import TensorType  # noqa: E402
from qcc.sim.engine import Runner, check_feeds  # noqa: E402
from qcc.sim.fixed import FixedRunner  # noqa: E402
from qcc.sim.interpreter import Interpreter  # noqa: E402


def chain(n: int) -> Model:
    g = Graph("chain")
    v = g.add_input("x", TensorType("float32", ("N", 4)))
    for i in range(n):
        v = g.add("Relu", v, name=f"r{i}")
    g.outputs = [v]
    return Model(g)


def bare(runner: Runner) -> Callable[[dict[str, np.ndarray]], None]:
    """The anchor: the runner's own kernels and stored constants, called by the barest loop."""
    graph = runner.model.graph
    plan = list(zip(graph.nodes, runner._kernels, runner._operands))
    inputs = graph.inputs

    def run(feeds: dict[str, np.ndarray]) -> None:
        env = dict(runner._consts)
        for value in inputs:
            env[id(value)] = runner.store_input(value, feeds[value.name])
        for node, kernel, operands in plan:
            for value, array in zip(node.outputs, kernel(node, [env[id(v)] if v is not None else None
                                                                for v in operands])):  # type: ignore[arg-type]
                env[id(value)] = array

    return run


def previous_loop(interp: Interpreter) -> Callable[[dict[str, np.ndarray]], object]:
    """Interpreter.run as it was before the shared engine (commit 9665539), on the same object:
    kernel lookup per node, trailing-None trimming and last-use checks per run."""
    from qcc.ir.registry import get_schema

    graph = interp.model.graph
    schemas = [get_schema(n.op) for n in graph.nodes]
    last_use: dict[int, int] = {}
    for step, node in enumerate(graph.nodes):
        for operand in node.inputs:
            if operand is not None:
                last_use[id(operand)] = step

    def run(feeds: dict[str, np.ndarray]) -> object:
        env: dict[int, np.ndarray] = dict(interp._consts)
        for name, array in check_feeds(interp.model, feeds).items():
            value = next(v for v in graph.inputs if v.name == name)
            env[id(value)] = interp._store(value, array)
            if interp.observer:
                interp.observer(value, env[id(value)])
        keep = {id(v) for v in graph.outputs}
        results: dict[str, np.ndarray] = {}
        for step, (node, schema) in enumerate(zip(graph.nodes, schemas)):
            args = [env[id(v)] if v is not None else None for v in node.inputs]
            while args and args[-1] is None:
                args.pop()
            kernel = interp.kernels.get(node.op)
            produced = kernel(node, args) if kernel else schema.kernel(node, args)  # type: ignore[arg-type]
            for value, array in zip(node.outputs, produced):
                array = interp._store(value, np.asarray(array))
                env[id(value)] = array
                if interp.observer:
                    interp.observer(value, array)
                if id(value) in keep:
                    results[value.name] = array
            for operand in node.inputs:
                if operand is not None and last_use.get(id(operand)) == step and id(operand) not in keep \
                        and id(operand) not in interp._consts:
                    env.pop(id(operand), None)
        return {v.name: results[v.name] if v.name in results else env[id(v)] for v in graph.outputs}

    return run


def best_pair(first: Callable[[], object], second: Callable[[], object], calls: int, repeats: int
              ) -> tuple[float, float]:
    """Best time per call of each, their rounds interleaved (load on a shared machine hits both)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - start) / calls)
    return min(times[0]), min(times[1])


def observe(value: Value, array: np.ndarray) -> None:
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import qcc
    from tests.fixed_models import annotate_fixed

    digits = ROOT / "examples" / "digits"
    x_digits = np.load(digits / "test.npz")["x"][:1]
    fixed = qcc.load(str(digits / "digits_cnn.onnx"))
    annotate_fixed(fixed, {"x": np.load(digits / "calib.npz")["x"][:32]}, 8)
    cases = [
        ("chain of 400 Relu, interpreter", Interpreter(chain(400), observer=observe),
         {"x": np.ones((1, 4), np.float32)}, 200),
        ("digits CNN, interpreter", Interpreter(qcc.load(str(digits / "digits_cnn.onnx")), observer=observe),
         {"x": x_digits}, 300),
        ("digits CNN fixed8, fixed-point runner (no observer)", FixedRunner(fixed), {"x": x_digits}, 30),
    ]
    print(f"bench_sim_loop: best of {args.repeats}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| model, runner | nodes | run (us) | bare loop, same kernels (us) | ratio | loop cost per node (us) |"
          " previous interpreter loop: ratio to bare |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, runner, feeds, calls in cases:
        nodes = len(runner.model.graph.nodes)
        anchor = bare(runner)
        t_run, t_bare = best_pair(lambda r=runner, f=feeds: r.run(f), lambda a=anchor, f=feeds: a(f), calls,
                                  args.repeats)
        previous = "-"
        if isinstance(runner, Interpreter):
            old = previous_loop(runner)
            t_old, t_bare2 = best_pair(lambda o=old, f=feeds: o(f), lambda a=anchor, f=feeds: a(f), calls,
                                       args.repeats)
            previous = f"{t_old / t_bare2:.2f}"
        print(f"| {label} | {nodes} | {t_run * 1e6:.0f} | {t_bare * 1e6:.0f} | {t_run / t_bare:.2f} | "
              f"{(t_run - t_bare) / nodes * 1e6:.2f} | {previous} |")

if __name__ == "__main__":
    main()
