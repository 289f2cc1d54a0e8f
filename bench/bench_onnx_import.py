"""Import/export speed of the ONNX frontend/backend against onnx.load/onnx.save in the same run.

Usage: python bench/bench_onnx_import.py [--repeat N]
Prints, per model, qcc import and export times and their ratio to onnx.load / onnx.save of the same
file, then import time on synthetic chains of 1k/10k/50k nodes (should grow linearly).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def chain_model(n: int) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    inits = [numpy_helper.from_array(np.ones(16, np.float32), "b")]
    prev = "x"
    for i in range(n):
        op = ("Relu", "Add", "Sigmoid", "Mul")[i % 4]
        ins = [prev, "b"] if op in ("Add", "Mul") else [prev]
        nodes.append(helper.make_node(op, ins, [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])], initializer=inits)
    return bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())


def main() -> None:
    import onnx

    from qcc.formats.onnx_export import to_onnx
    from qcc.frontends.onnx import load_onnx
    from tests.onnx_zoo import light_path

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':<22} {'nodes':>6} {'onnx.load':>10} {'qcc import':>11} {'ratio':>6} "
          f"{'onnx.save':>10} {'qcc export':>11} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("densenet121", "resnet50"):
            path = str(light_path(name))
            proto = onnx.load(path)
            t_load = best_of(lambda: onnx.load(path), args.repeat)
            model = load_onnx(path)
            t_import = best_of(lambda: load_onnx(path), args.repeat)
            out = os.path.join(tmp, "o.onnx")
            t_save = best_of(lambda: onnx.save(proto, out), args.repeat)
            t_export = best_of(lambda: open(out, "wb").write(to_onnx(model).SerializeToString()), args.repeat)
            print(f"light_{name:<16} {len(model.graph.nodes):>6} {t_load * 1e3:>8.1f}ms {t_import * 1e3:>9.1f}ms "
                  f"{t_import / t_load:>6.1f} {t_save * 1e3:>8.1f}ms {t_export * 1e3:>9.1f}ms {t_export / t_save:>6.1f}")
        print()
        print(f"{'chain nodes':>11} {'qcc import':>11} {'us/node':>8}")
        for n in (1000, 10000, 50000):
            data = chain_model(n)
            path = os.path.join(tmp, f"chain{n}.onnx")
            Path(path).write_bytes(data)
            t = best_of(lambda: load_onnx(path), 1 if n > 10000 else args.repeat)
            print(f"{n:>11} {t * 1e3:>9.1f}ms {t / n * 1e6:>8.1f}")


if __name__ == "__main__":
    main()
