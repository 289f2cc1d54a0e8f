"""Where one `qcc compile` process spends its time, phase by phase, for two checkouts A/B.

Issue 19 compares whole processes (qcc against quantize_static), so this times what such a process
does: interpreter start, imports, model load, each pass, the pass manager's verification, the
backend's write, the report, and the rest (summary, exit). Each measurement is a fresh process
(`python -m qcc compile`, its bytecode compiled as an installed package's: bench/bytecode.py)
with timers wrapped around those functions; wall and CPU seconds (CPU counts every thread, so
calibrate's two threads can exceed its wall time). The checkouts run interleaved, run after run,
so a load change on a shared machine hits both; medians are printed with B/A ratios.

Run: .venv/bin/python bench/compile_phases.py --checkout A=/work/main --checkout B=. \\
     [--models resnet50,densenet121] [--configs "int8 minmax;uint8 entropy"] [--runs 5]
Every config adds --no-bias-correct --no-equalize unless --defaults (quantize_static's work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter(); c_start = time.process_time()
co, out_json, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, co)
phases = {}

def add(name, wall, cpu):
    w, c = phases.get(name, (0.0, 0.0))
    phases[name] = (w + wall, c + cpu)

def timed(name, fn):
    def wrapper(*args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            add(name, time.perf_counter() - t, time.process_time() - c)
    return wrapper

import qcc.cli
import qcc.driver
import qcc.pm.manager
add("imports", time.perf_counter() - t_start, time.process_time() - c_start)
driver, manager = qcc.driver, qcc.pm.manager
driver.load = timed("load", driver.load)
driver.build_report = timed("report", driver.build_report)
manager.verify_model = timed("verify", manager.verify_model)
build, resolve = manager.build_passes, driver.resolve_target

def build_passes(*args, **kwargs):
    passes = build(*args, **kwargs)
    for p in passes:
        cls = type(p)
        if not getattr(cls.run, "_timed", False):
            cls.run = timed(p.name, cls.run)
            cls.run._timed = True
    return passes

def resolve_target(*args, **kwargs):
    backend, opts = resolve(*args, **kwargs)
    cls = type(backend)
    if not getattr(cls.write, "_timed", False):
        cls.write = timed("write", cls.write)
        cls.write._timed = True
    return backend, opts

manager.build_passes = build_passes
driver.build_passes = build_passes
driver.resolve_target = resolve_target
sys.argv = ["qcc", *argv]
try:
    qcc.cli.main()  # as `qcc` runs it: main() reads sys.argv (and tunes the process as it does then)
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
total = (time.perf_counter() - t_start, time.process_time() - c_start)
add("other", total[0] - sum(w for w, _ in phases.values()), total[1] - sum(c for _, c in phases.values()))
with open(out_json, "w") as fh:
    json.dump(phases, fh)
"""


def measure(co: Path, model: Path, calib: Path, config: str, work: Path, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """One compile process of checkout `co`: its phases, plus 'start' (interpreter start-up and
    exit: the process's wall and CPU outside the child's own clock) and 'total'."""
    out = work / "phases.json"
    argv = [str(co / ".venv" / "bin" / "python"), "-c", CHILD, str(co), str(out), "compile", str(model),
            "-o", str(work / "out.onnx"), "--target", "onnx-qdq", "--calib", str(calib), *config.split()]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=co, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv[3:])} failed in {co}")
    phases = {k: tuple(v) for k, v in json.loads(out.read_text()).items()}
    cpu = usage.ru_utime + usage.ru_stime
    phases["start"] = (wall - sum(w for w, _ in phases.values()), cpu - sum(c for _, c in phases.values()))
    phases["total"] = (wall, cpu)
    return phases  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    from bench.compare_ort_quant import prepare

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--checkout", action="append", required=True, help="LABEL=PATH (a checkout with its .venv)")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--configs", default="--quantize int8 --method minmax")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--defaults", action="store_true", help="keep bias correction and equalization")
    args = ap.parse_args(argv)
    checkouts = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.checkout]
    extra = "" if args.defaults else " --no-bias-correct --no-equalize"
    print(f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        envs = {}
        for label, co in checkouts:  # each its own bytecode cache, compiled before timing (bench/bytecode.py)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = str(work / f"pycache_{label}")
            subprocess.run([str(co / ".venv" / "bin" / "python"), "-m", "compileall", "-q", "qcc", "passes",
                            "backends"], cwd=co, env=env, check=True, stdout=subprocess.DEVNULL)
            envs[label] = env
        for name in args.models.split(","):
            case = prepare(name, work, 8, 1)
            for config in args.configs.split(";"):
                runs: dict[str, list[dict[str, tuple[float, float]]]] = {label: [] for label, _ in checkouts}
                for _ in range(args.runs):
                    for label, co in checkouts:
                        runs[label].append(measure(co, case.model, case.calib, config + extra, work, envs[label]))
                report(name, config + extra, checkouts, runs)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def report(model: str, config: str, checkouts: list[tuple[str, Path]],
           runs: dict[str, list[dict[str, tuple[float, float]]]]) -> None:
    labels = [label for label, _ in checkouts]
    names: list[str] = []
    for label in labels:
        for r in runs[label]:
            names += [k for k in r if k not in names]
    order = ["start", "imports", "load"] + [n for n in names if n not in ("start", "imports", "load", "verify",
                                                                           "write", "report", "other", "total")]
    order += ["verify", "write", "report", "other", "total"]
    print(f"\n{model}: qcc compile {config} (median of {len(runs[labels[0]])} runs, seconds)")
    head = " | ".join(f"{label} wall | {label} CPU" for label in labels)
    ratio = f" | {labels[1]}/{labels[0]} wall | {labels[1]}/{labels[0]} CPU" if len(labels) == 2 else ""
    print(f"| phase | {head}{ratio} |")
    print("|---" * (1 + 2 * len(labels) + (2 if ratio else 0)) + "|")
    for phase in order:
        med = {label: tuple(statistics.median(r.get(phase, (0.0, 0.0))[k] for r in runs[label]) for k in (0, 1))
               for label in labels}
        cells = " | ".join(f"{med[label][0]:.3f} | {med[label][1]:.3f}" for label in labels)
        if ratio:
            a, b = med[labels[0]], med[labels[1]]
            cells += " | " + " | ".join(f"{b[k] / a[k]:.2f}" if a[k] > 0.005 else "-" for k in (0, 1))
        print(f"| {phase} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
