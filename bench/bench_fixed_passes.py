"""Per-pass CPU of the fixed-point compile, this checkout against another one, same run.

    git archive main | tar -x -C /tmp/base && ln -s ../passes /tmp/base/qcc/passes && ln -s ../backends /tmp/base/qcc/backends
    .venv/bin/python bench/bench_fixed_passes.py --baseline /tmp/base [--reps 3] [--rounds 2]

torchvision mobilenet_v2 96x96 with random weights and 16 calibration images (bench/ptq.py's
`torchvision_files`), to .nnb with FIXED8 and FIXED16: the new defaults (equalize, bias-correct,
method auto) and the old flags (no equalize, no bias correction; method mse for fixed8, minmax for
fixed16), each `qcc.compile` in-process with a wrapper timing each pass's `run` (process CPU,
BLAS threads included). Fresh processes alternate between the baseline (its tree first on
PYTHONPATH; the symlinks map qcc.passes and qcc.backends as setup.py does) and this checkout, so
load changes hit both; each cell is the minimum over reps * rounds compiles (the least disturbed
run on a shared machine). The old-flags compile runs check-fixed-point's own integer run, the new
one bias-correct's (check-fixed-point then reads it): the integer kernels weigh on both sides of
the issue-18 ratio.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PASSES = ["TOTAL", "equalize", "calibrate", "assign-fixed-point", "bias-correct", "check-fixed-point"]


def child(scheme: str, rounds: int, model: str, calib: str, out: str) -> None:
    """In the child: compile `rounds` times each way, print [(flags, total CPU, {pass: CPU})]."""
    from qcc.driver import compile as qcc_compile
    from qcc.pm import manager

    spent: dict[str, float] = collections.defaultdict(float)
    run = manager.PassManager.run

    def timed_run(self: Any, model: Any, ctx: Any = None) -> Any:
        for p in self.passes:
            cls = type(p)
            if not cls.__dict__.get("_timed", False):
                original = cls.run

                def wrapped(pass_: Any, m: Any, c: Any, original: Any = original) -> Any:
                    start = time.process_time()
                    try:
                        return original(pass_, m, c)
                    finally:
                        spent[pass_.name] += time.process_time() - start

                cls.run, cls._timed = wrapped, True
        return run(self, model, ctx)

    manager.PassManager.run = timed_run  # type: ignore[method-assign]
    old = {"method": "mse" if scheme == "fixed8" else "minmax", "equalize": False, "bias_correct": False}
    qcc_compile(model, out, calib=calib, quantize=scheme)  # warm-up: imports, caches
    rows = []
    for _ in range(rounds):
        for flags, options in (("old", old), ("new", {})):
            spent.clear()
            cpu = time.process_time()
            qcc_compile(model, out, calib=calib, quantize=scheme, **options)
            rows.append([flags, time.process_time() - cpu, dict(spent)])
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--baseline", required=True, help="another checkout's tree (see the docstring)")
    ap.add_argument("--reps", type=int, default=3, help="process pairs per scheme")
    ap.add_argument("--rounds", type=int, default=2, help="compiles of each kind per process")
    ap.add_argument("--child", nargs=4, metavar=("SCHEME", "ROUNDS", "MODEL", "CALIB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        scheme, rounds, model, calib = args.child
        with tempfile.TemporaryDirectory() as tmp:
            child(scheme, int(rounds), model, calib, str(Path(tmp) / "t.nnb"))
        return
    sys.path.insert(0, str(ROOT))
    from bench.ptq import torchvision_files

    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        files = torchvision_files(Path(tmp))
        for scheme in ("fixed8", "fixed16"):
            best: dict[tuple[str, str, str], float] = {}
            for _ in range(args.reps):
                for side, path in (("baseline", args.baseline), ("this", "")):
                    env = dict(os.environ, PYTHONPATH=path)
                    argv = [sys.executable, str(Path(__file__).resolve()), "--baseline", args.baseline, "--child",
                            scheme, str(args.rounds), str(files.model), str(files.calib)]
                    out = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, check=True).stdout
                    for flags, total, passes in json.loads(out):
                        for name, seconds in [("TOTAL", total), *passes.items()]:
                            key = (side, flags, name)
                            best[key] = min(best.get(key, float("inf")), seconds)
            print(f"\n{scheme}, .nnb: CPU seconds, minimum of {args.reps * args.rounds} compiles each\n")
            print("| pass | old flags, baseline | old flags, this | new, baseline | new, this |")
            print("|---|---:|---:|---:|---:|")
            for name in PASSES:
                cells = [best.get((side, flags, name)) for flags in ("old", "new") for side in ("baseline", "this")]
                print(f"| {name} | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells) + " |")
            for side in ("baseline", "this"):
                print(f"{side}: new / old CPU {best[(side, 'new', 'TOTAL')] / best[(side, 'old', 'TOTAL')]:.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
