"""The model sweeps moved out of the test suite (issue 16: the suite stays under 6 minutes on 2
idle cores; tests keep one small representative per behaviour). Each row runs the same test
function pytest runs, on a model the suite no longer does, and prints pass/FAIL and its time.

    PYTHONPATH=. .venv/bin/python bench/model_sweeps.py [--only light|plan|torchvision]

- light: tests/test_onnx_light.py::test_light_graph_round_trip on every light zoo graph;
- plan: tests/test_memory_plan.py::test_model_plans_are_within_one_percent_of_the_bounds on every
  zoo model, float and fixed8;
- torchvision: tests/test_frontend_torch.py::test_torchvision_model_matches_torch on every model.
Results: docs/benchmarks.md, "Model sweeps".
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def light() -> list[tuple[str, Callable[[], Any]]]:
    from tests.onnx_zoo import LIGHT_NAMES
    from tests.test_onnx_light import ROUND_TRIPPED_IN_TESTS, test_light_graph_round_trip

    return [(f"light round trip {n}", lambda n=n: test_light_graph_round_trip(n))
            for n in LIGHT_NAMES if n not in ROUND_TRIPPED_IN_TESTS]


def plan() -> list[tuple[str, Callable[[], Any]]]:
    from tests import memory_models as mm
    from tests.test_memory_plan import (
        PLANNED_IN_TESTS,
        ZOO_NAMES,
        _zoo,
        test_model_plans_are_within_one_percent_of_the_bounds,
    )

    rows = []
    for name in ZOO_NAMES:
        if name in PLANNED_IN_TESTS:
            continue

        def case(name: str = name) -> None:
            models = {n: mm.load(data, n) for n, data in _zoo((name,))}
            for scheme in ("", "fixed8"):
                test_model_plans_are_within_one_percent_of_the_bounds(models, name, scheme)

        rows.append((f"memory plan {name} (float, fixed8)", case))
    return rows


def torchvision() -> list[tuple[str, Callable[[], Any]]]:
    from tests.test_frontend_torch import (
        COMPARED_IN_TESTS,
        TORCHVISION,
        test_torchvision_model_matches_torch,
    )

    return [(f"torchvision {n} vs torch", lambda n=n: test_torchvision_model_matches_torch(n))
            for n in TORCHVISION if n not in COMPARED_IN_TESTS]


SWEEPS = {"light": light, "plan": plan, "torchvision": torchvision}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SWEEPS))
    args = parser.parse_args(argv)
    failed = 0
    print("| case | result | seconds |\n|---|---|---:|")
    for key, make in SWEEPS.items():
        if args.only and key != args.only:
            continue
        for label, case in make():
            start = time.perf_counter()
            try:
                case()
                result = "pass"
            except Exception as exc:  # a sweep reports every case, then fails
                failed += 1
                result = f"FAIL: {type(exc).__name__}: {str(exc)[:120]}"
                traceback.print_exc(file=sys.stderr)
            print(f"| {label} | {result} | {time.perf_counter() - start:.1f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
