"""Calibration at the floor and on several workers (issue 19, items 3 and 4).

Three measurements, each configuration a fresh whole process, repeated and interleaved (A B C A
B C ...) so the machine's drift hits every configuration alike; medians with min-max spreads, the
load average before and after, CPU time (user + sys of the process and its waited children) beside
wall time.

1. floor: light_resnet50 / light_densenet121 (tests/onnx_zoo.py, random weights), S random
   samples. In one process per configuration: one plain ONNX Runtime float pass over the samples
   (default session options, one sample per run: the model's batch is 1), or qcc's `collect`
   (every float activation histogrammed) with the interpreter on the model as loaded, and with
   the interpreter or onnxruntime as the engine on the model `qcc compile --quantize int8`
   calibrates (batch norms folded by fold-bn first; ONNX Runtime fuses them too). Two more ORT
   rows make every node output a graph output, or every one but those only a Relu or BatchNorm
   reads (Conv+BN+Relu still fuse: the tensors a QDQ model quantizes), with the same default
   session (both cores, nothing else done): what reading the activations costs onnxruntime
   itself, a floor for any calibration through it, statistics or not.
   The phase is timed inside the process after loading; the ratio is calibration / ORT pass of
   the same repetition.
2. rss: peak RSS growth (VmHWM minus VmRSS once model and data are loaded) of `collect` on a
   static-batch ResNet tail (tests/test_calib_scale.py) at 100 and 1000 samples, with the
   interpreter and with onnxruntime as the engine.
3. workers: `qcc compile --quantize int8` of light_resnet50 with S samples, `--workers 1` (the
   default single process, with its BLAS threads), `--workers 2`, and `--cluster` on a Dask
   LocalCluster of 2 single-thread worker processes started by this script (its start-up is not
   timed); with --one-thread-row also the single process limited to one BLAS thread (a worker's
   budget), labelled as such. The output files are compared byte for byte. CPU time is the whole
   tree's: the process and its waited children, plus what the Dask workers spent meanwhile
   (/proc); "cores" is CPU / wall. RSS is the peak of the sum over the process tree (polled every
   50 ms; the Dask workers included) plus the arrays the cluster client filed in /dev/shm
   (qcc.pm.cluster), which no process's RSS shows.

Run: .venv/bin/python bench/bench_calib_scale.py [--parts floor,rss,workers] [--repeat 3]
     [--floor-samples 8] [--workers-samples 160] [--one-thread-row] [--no-write] [--base DIR]
With --base DIR (a plain tree of another commit, with the qcc/passes and qcc/backends symlinks
bench/ab_calib_floor.py describes), the workers part also runs that checkout's 1 process,
--workers 2 and --cluster (its own LocalCluster) interleaved with these.
Results are printed and written to docs/benchmarks.md under "## Calibration at scale".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Calibration at scale"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.bytecode import compiled_env  # noqa: E402


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# ----------------------------------------------------------------------------- in-process workers
def floor_worker(mode: str, model_path: str, samples: int) -> dict[str, Any]:
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    inp = graph.input[0]
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    data = np.random.default_rng(0).standard_normal((samples, *dims[1:]), dtype=np.float32)
    if mode.startswith("ort-"):
        import onnxruntime as ort

        session = ort.InferenceSession(*_ort_model(model_path, mode),
                                       providers=["CPUExecutionProvider"])
        t0, c0 = time.perf_counter(), _cpu()
        for i in range(samples):
            session.run(None, {inp.name: data[i:i + 1]})
    else:
        from qcc.passes.calibrate import collect

        from qcc.driver import load
        from qcc.pm.manager import PassManager

        engine, _, folded = mode.partition("+")
        model = load(model_path)
        if folded:  # the model `qcc compile --quantize int8` calibrates: batch norms folded first
            model = PassManager("fold-bn{standalone=conv}").run(model).model
        t0, c0 = time.perf_counter(), _cpu()
        collect(model, {inp.name: data}, 1, engine=engine, rebatch=32)
    return {"wall": time.perf_counter() - t0, "cpu": _cpu() - c0}


def _ort_model(model_path: str, mode: str) -> tuple[Any, Any]:
    """(model, session options) of the ORT rows, onnxruntime's defaults (both cores, every
    optimization): "ort-pass" the plain model; "ort-every-output" every node output made a graph
    output (what qcc's calibration reads); "ort-qdq-outputs" all but the outputs whose every reader
    is a Relu or BatchNormalization (those ORT's QDQ kernels fuse), so Conv+BN+Relu still fuse. The
    last two are floors for calibrating through onnxruntime: no statistics, and at 2 threads not
    deterministic (their sums depend on the batch and the threads)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    if mode == "ort-pass":
        return model_path, options
    model = onnx.load(model_path)
    graph = model.graph
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    named = {o.name for o in graph.output} | {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.output:
            fused = bool(readers.get(name)) and all(op in ("Relu", "BatchNormalization") for op in readers[name])
            if name and name not in named and not (mode == "ort-qdq-outputs" and fused):
                graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                named.add(name)
    return model.SerializeToString(), options


def rss_worker(samples: int, engine: str = "qcc") -> dict[str, Any]:
    from qcc.passes.calibrate import collect

    from qcc.driver import load
    from tests.test_calib_scale import static_batch_onnx

    with tempfile.TemporaryDirectory() as tmp:
        model = load(str(static_batch_onnx(Path(tmp) / "tail.onnx")))
    data = {"x": np.random.default_rng(0).standard_normal((samples, 3, 12, 12), dtype=np.float32)}
    base = _status_mb("VmRSS")
    t0 = time.perf_counter()
    collect(model, data, 1, engine=engine, rebatch=32)
    return {"wall": time.perf_counter() - t0, "growth": _status_mb("VmHWM") - base, "data_mb": data["x"].nbytes / 2**20}


# ----------------------------------------------------------------------------- process runs
def run_json(argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tree_rss_mb(root: int) -> float:
    """RSS of `root` and every descendant (from /proc), in MB."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total / 2**20


def _cpu_of(pids: Sequence[int]) -> float:
    """CPU seconds (user + sys, waited children included) the processes `pids` have spent."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def _shm_mb() -> float:
    """The arrays cluster clients have filed in /dev/shm (tmpfs: memory no process's RSS shows)."""
    total = 0
    for folder in Path("/dev/shm").glob("qcc-arrays-*"):
        with contextlib.suppress(OSError):
            total += sum(f.stat().st_size for f in folder.iterdir())
    return total / 2**20


def timed_process(argv: list[str], also: Sequence[int] = (), env: dict[str, str] | None = None,
                  cwd: Path = ROOT) -> dict[str, Any]:
    """Wall, CPU (the process and its waited children, + what the `also` pids spent meanwhile) and
    peak RSS of the tree (+ the `also` pids and the arrays filed in /dev/shm)."""
    peak = [0.0]
    cpu_before = _cpu_of(also)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid) + sum(_tree_rss_mb(p) for p in also) + _shm_mb())
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    if status:
        raise RuntimeError(f"{argv}: exit status {status}: {proc.stderr.read().decode() if proc.stderr else ''}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime + _cpu_of(also) - cpu_before, "rss": peak[0]}


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


# ----------------------------------------------------------------------------- parts
def part_floor(work: Path, names: list[str], samples: int, repeat: int) -> list[str]:
    from compare_ort_quant import light_model

    lines = [f"### Calibration vs one plain ONNX Runtime float pass ({samples} samples, {repeat} repetitions)", "",
             "| model | run | wall s | CPU s | ratio to the ORT pass (wall) | ratio (CPU) |",
             "|---|---|---|---|---|---|"]
    modes = ["ort-pass", "ort-every-output", "ort-qdq-outputs", "qcc", "qcc+fold", "onnxruntime+fold"]
    for name in names:
        path = work / f"light_{name}.onnx"
        light_model(name, path)
        got: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(repeat):
            for mode in modes:
                got[mode].append(run_json(["--floor-worker", mode, str(path), str(samples)]))
        for mode in modes:
            walls = [r["wall"] for r in got[mode]]
            cpus = [r["cpu"] for r in got[mode]]
            ratios = [r["wall"] / b["wall"] for r, b in zip(got[mode], got["ort-pass"])]
            cratios = [r["cpu"] / b["cpu"] for r, b in zip(got[mode], got["ort-pass"])]
            label = {"ort-pass": "ORT float pass",
                     "ort-every-output": "ORT float pass, every activation an output (no statistics)",
                     "ort-qdq-outputs": "ORT float pass, the activations a QDQ model quantizes (no statistics)",
                     "qcc": "qcc calibrate (interpreter), model as loaded",
                     "qcc+fold": "qcc calibrate (interpreter), after fold-bn",
                     "onnxruntime+fold": "qcc calibrate{engine=onnxruntime}, after fold-bn"}[mode]
            lines.append(f"| {name} | {label} | {spread(walls)} | {spread(cpus)} | {spread(ratios)} | {spread(cratios)} |")
        print("\n".join(lines[-3:]), flush=True)
    return [*lines, ""]


def part_rss(counts: list[int]) -> list[str]:
    lines = ["### Calibration memory against the sample count (static-batch ResNet tail, rebound to 32)", "",
             "| engine | samples | data MB | wall s | peak RSS growth MB |", "|---|---|---|---|---|"]
    for engine in ("qcc", "onnxruntime"):
        for n in counts:
            r = run_json(["--rss-worker", str(n), engine])
            lines.append(f"| {engine} | {n} | {r['data_mb']:.1f} | {r['wall']:.2f} | {r['growth']:.1f} |")
            print(lines[-1], flush=True)
    return [*lines, ""]


def _local_cluster(root: Path) -> Any:
    """2 single-thread Dask workers that import qcc from `root` (spawned: they inherit this
    process's sys.path and working directory as they are meanwhile)."""
    from distributed import LocalCluster

    here, path = os.getcwd(), list(sys.path)
    os.chdir(root)
    sys.path.insert(0, str(root))
    try:
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    finally:
        os.chdir(here)
        sys.path[:] = path


def part_workers(work: Path, samples: int, repeat: int, one_thread_row: bool, base: Path | None = None) -> list[str]:
    from compare_ort_quant import light_model, random_input

    path = work / "light_resnet50.onnx"
    input_name, dims = light_model("resnet50", path)
    calib = work / "calib.npz"
    np.savez(calib, **{input_name: random_input((samples, *dims[1:]), seed=0)})
    command = [sys.executable, "-m", "qcc", "compile", str(path), "--quantize", "int8", "--calib", str(calib), "-q"]
    # the compiles and the Dask workers run with compiled bytecode (bench/bytecode.py), in this
    # environment otherwise (computed before the clear: it once ran them with PYTHONPYCACHEPREFIX
    # alone, without the machine's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, i.e. other sgemm bits)
    compiled = compiled_env(work)
    os.environ.clear()
    os.environ.update(compiled)
    environment = dict(os.environ)
    if base is not None:  # its bytecode compiled too, as this checkout's
        subprocess.run([sys.executable, "-m", "compileall", "-q", "qcc", "passes", "backends"], cwd=base,
                       env=environment, check=True, stdout=subprocess.DEVNULL)
    clusters = {ROOT: _local_cluster(ROOT), **({base: _local_cluster(base)} if base is not None else {})}
    # Dask's nannies set MALLOC_TRIM_THRESHOLD_=65536 in this process's environment for their workers;
    # a timed `qcc compile` that inherited it paid a page fault per activation page (2.4x slower alone)
    os.environ.clear()
    os.environ.update(environment)
    pids = {root: [int(w.process.pid) for w in c.workers.values()] for root, c in clusters.items()}  # type: ignore[union-attr]
    one_thread = {**environment, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    Config = tuple[list[str], dict[str, str] | None, Path]
    configs: dict[str, Config] = {"1 process (default)": (["--workers", "1"], None, ROOT)}
    if one_thread_row:
        configs["1 process, 1 BLAS thread (a worker's budget, not the default)"] = (["--workers", "1"], one_thread, ROOT)
    configs["--workers 2"] = (["--workers", "2"], None, ROOT)
    configs["--cluster (Dask, 2 workers)"] = (["--cluster", clusters[ROOT].scheduler_address], None, ROOT)
    if base is not None:  # the other checkout's runs, interleaved with these (qcc imported from its tree)
        configs["base: 1 process"] = (["--workers", "1"], None, base)
        configs["base: --workers 2"] = (["--workers", "2"], None, base)
        configs["base: --cluster (Dask, 2 workers)"] = (["--cluster", clusters[base].scheduler_address], None, base)
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    outputs: dict[str, bytes] = {}
    try:
        for _ in range(repeat):
            for label, (flags, env, root) in configs.items():
                out = work / f"out_{len(outputs)}.onnx"
                got[label].append(timed_process([*command, "-o", str(out), *flags],
                                                pids[root] if "cluster" in label else [], env, root))
                outputs[label] = out.read_bytes()
                out.unlink()
    finally:
        for cluster in clusters.values():
            cluster.close()
    first = outputs["1 process (default)"]
    first_base = outputs.get("base: 1 process", first)
    lines = [f"### Sharded calibration: light_resnet50, {samples} samples, qcc compile --quantize int8 "
             f"({repeat} repetitions)", "",
             "| run | wall s | CPU s (whole tree, Dask workers included) | cores used (CPU / wall) | "
             "speed-up (wall, pairwise, vs the same checkout's 1 process) | peak RSS MB (tree + /dev/shm) | "
             "output bytes (vs the same checkout's 1 process) |",
             "|---|---|---|---|---|---|---|"]
    for label in configs:
        rows = got[label]
        anchor = "base: 1 process" if label.startswith("base") else "1 process (default)"
        speed = [b["wall"] / r["wall"] for r, b in zip(rows, got[anchor])]
        same = "identical" if outputs[label] == (first_base if label.startswith("base") else first) else "DIFFERENT"
        lines.append(f"| {label} | {spread([r['wall'] for r in rows])} | {spread([r['cpu'] for r in rows])} | "
                     f"{spread([r['cpu'] / r['wall'] for r in rows])} | {spread(speed)} | "
                     f"{spread([r['rss'] for r in rows], '{:.0f}')} | {same} |")
        print(lines[-1], flush=True)
    return [*lines, ""]


def write_section(lines: list[str], args: argparse.Namespace) -> None:
    import onnxruntime

    head = [SECTION, "",
            f"`bench/bench_calib_scale.py`, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"numpy {np.__version__}, onnxruntime {onnxruntime.__version__}. Each configuration is a fresh process, "
            f"repeated {args.repeat} times interleaved; medians with (min-max). 1-minute load average "
            f"{args.load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other engineers' jobs share "
            "the 2 cores).", ""]
    text = DOC.read_text()
    body = "\n".join([*head, *lines]).rstrip() + "\n"
    if SECTION in text:
        before, _, after = text.partition(SECTION)
        rest = after.split("\n## ", 1)
        text = before + body + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip() + "\n\n" + body
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--parts", default="floor,rss,workers")
    ap.add_argument("--models", default="resnet50,densenet121")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--floor-samples", type=int, default=8)
    ap.add_argument("--rss-samples", default="100,1000")
    ap.add_argument("--workers-samples", type=int, default=160,
                    help="160: a single-process compile of >= 30 s on a quiet 2-core machine (issue 19)")
    ap.add_argument("--one-thread-row", action="store_true",
                    help="also the single process with one BLAS thread (a worker's budget; labelled, not the baseline)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--base", type=Path, help="another checkout (a plain tree with qcc/passes and qcc/backends "
                    "symlinks, as bench/ab_calib_floor.py's) whose workers rows run interleaved with these")
    ap.add_argument("--floor-worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--rss-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_worker:
        mode, path, n = args.floor_worker
        print(json.dumps(floor_worker(mode, path, int(n))))
        return
    if args.rss_worker:
        print(json.dumps(rss_worker(int(args.rss_worker[0]), args.rss_worker[1])))
        return
    args.load = os.getloadavg()
    parts = args.parts.split(",")
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "floor" in parts:
            lines += part_floor(work, args.models.split(","), args.floor_samples, args.repeat)
        if "rss" in parts:
            lines += part_rss([int(n) for n in args.rss_samples.split(",")])
        if "workers" in parts:
            lines += part_workers(work, args.workers_samples, args.repeat, args.one_thread_row, args.base)
    print("\n".join(lines))
    if not args.no_write:
        write_section(lines, args)
        print(f"written to {DOC}")


if __name__ == "__main__":
    main()
