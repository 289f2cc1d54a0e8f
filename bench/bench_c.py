"""Benchmark target c: latency against ONNX Runtime and nnabla-c-runtime, code size and arena.

    .venv/bin/python bench/bench_c.py [--models digits resnet23 squeezenet shufflenet] [--corpus NAME ...]
        [--modes float32 int8 fixed8] [--rounds 7] [--batch-s 0.3] [--cpu 1] [--callgrind]
        [--record docs/benchmarks.md]

Per model and numeric mode, the generated C is built twice with its own Makefile: the portable
default (`make`: -std=c99 -O3, no instruction-set flag) and `make ARCH_FLAGS="-O3 -march=native"`,
and run through its main.c (`./model IN OUT REPEATS`: CPU time per inference); affine modes' native
build is generated with `--target c{isa=dot8}` where -march=native has an 8-bit dot product (VNNI,
DOTPROD), the default source built native beside it. Beside it, in the
same process and the same rounds: ONNX Runtime on the float model and on qcc's int8 QDQ model
(`--target onnx-qdq --quantize int8`), one intra-op and one inter-op thread, all graph
optimizations; and nnabla-c-runtime (`nnablart infer`, found on PATH, in QCC_NNABLART or at the
tests' default path) on qcc's .nnb of the same model (float, fixed8 when the mode is fixed point):
per-process CPU time of `infer` minus that of `dump` (loading the same file), so it counts the
forward pass and its buffers. The process is pinned to one core (`--cpu`; children inherit it).

Every variant runs `--rounds` times, the rounds interleaved so load changes hit all variants
alike; each round times a batch of at least `--batch-s` seconds. Reported: the median over rounds
and the spread (min-max). Ratios are taken between medians of the same run. `--callgrind` adds
valgrind instruction counts of one C inference (portable and `-O3 -mavx2 -mfma` builds: valgrind
has no AVX-512) and of nnablart, a load-independent second measure.

Models: the digits CNN (examples/digits), seed 003's ResNet23 at 1x3x32x32 (tests/nnabla_zoo.py,
random weights; needs nnabla), the onnx package's light SqueezeNet and ShuffleNet with seeded random
weights (tests/onnx_zoo.py). `--corpus KEY ...` adds real models of the corpus (`bench/corpus.py`,
branch models17; imported only then, and the run stops with a message naming the missing module
when it is absent): the model file its `model_file` fetches into the cache, bound to the corpus's
input shape, 4 calibration samples and the timed input from its `samples` (real photos, faces, text
lines). Calibration otherwise: 4 standard-normal samples (digits: its calib.npz). `--record` replaces (or appends) the "C backend" section of a
markdown file (bench/doc_section.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HEADING = "## C backend"
DIGITS = ROOT / "examples" / "digits"
NATIVE = "-O3 -march=native"
SCHEMES = {"float32": "none", "int8": "int8", "uint8": "uint8", "fixed8": "fixed8", "fixed16": "fixed16"}
AFFINE = ("int8", "uint8")


# ---------------------------------------------------------------- models


@attrs.frozen
class Source:
    """A model to benchmark: the file qcc reads, and what the corpus adds to it."""

    path: Path
    calib: Path | None = None  # calibration .npz (None: standard-normal samples)
    shapes: dict[str, tuple[int, ...]] | None = None  # input shapes to bind (the corpus's dynamic dims)
    sample: np.ndarray | None = None  # the timed input (None: standard normal)


def model_source(name: str, tmp: Path) -> Source:
    if name == "digits":
        return Source(DIGITS / "digits_cnn.onnx", DIGITS / "calib.npz")
    if name == "resnet23":
        from tests.nnabla_zoo import save_resnet23

        path = tmp / "resnet23.nnp"
        save_resnet23(path)
        return Source(path)
    if name in ("squeezenet", "shufflenet"):
        from tests.onnx_zoo import randomized_bytes

        path = tmp / f"{name}.onnx"
        path.write_bytes(randomized_bytes(name))
        return Source(path)
    return corpus_source(name, tmp)


def corpus_source(key: str, tmp: Path) -> Source:
    """A corpus model (bench/corpus.py) with 4 calibration samples and one timed sample, all real inputs."""
    try:
        from bench import corpus  # type: ignore[attr-defined,unused-ignore]  # lands with branch models17
    except ImportError as exc:
        raise SystemExit(f"bench_c: --corpus {key} needs bench/corpus.py (branch models17), which this checkout "
                         f"does not have ({exc})") from None
    models = {m.key: m for m in corpus.MODELS}
    if key not in models:
        raise SystemExit(f"bench_c: {key} is not a corpus model; bench/corpus.py has {', '.join(models)}")
    model = models[key]
    if len(model.shapes) != 1:
        raise SystemExit(f"bench_c: {key} has {len(model.shapes)} inputs; the C harness times one-input models")
    path = corpus.model_file(model)
    images = corpus.archive(corpus.IMAGES)
    calib = tmp / f"{key}_calib.npz"
    np.savez(calib, **corpus.samples(model, path, 4, 0, images))
    (sample,) = corpus.samples(model, path, 1, 1000, images).values()
    return Source(path, calib, {k: tuple(v) for k, v in model.shapes.items()}, np.asarray(sample, np.float32))


def shape_options(source: Source) -> dict[str, Any]:
    """How qcc binds the corpus's input shape: `input_shapes` where the driver has it (branch models17),
    else `batch_size` (enough when the batch is the only dynamic dim)."""
    if source.shapes is None:
        return {}
    from qcc.driver import CompileOptions

    if "input_shapes" in attrs.fields_dict(CompileOptions):
        return {"input_shapes": {k: list(v) for k, v in source.shapes.items()}}
    (shape,) = source.shapes.values()
    return {"batch_size": shape[0]}


def float_onnx(src: Path, tmp: Path, name: str) -> Path:
    """The float model as ONNX (for ONNX Runtime): the source itself, or qcc's export of it."""
    if src.suffix == ".onnx":
        return src
    import qcc.driver

    out = tmp / f"{name}_float.onnx"
    qcc.driver.compile(str(src), out, target="onnx")
    return out


# ---------------------------------------------------------------- timing


@attrs.define
class Variant:
    """One way of running a model: `run(n)` returns CPU microseconds per inference over n runs."""

    label: str
    run: Callable[[int], float]
    repeats: int = 1
    samples: list[float] = attrs.field(factory=list)

    def calibrate(self, budget: float) -> None:
        """Choose the batch size that takes at least `budget` seconds."""
        n = 1
        while True:
            us = self.run(n)
            if us * n >= budget * 1e6 or n >= 100000:
                break
            n = max(n * 2, int(budget * 1e6 / max(us, 1e-3)) + 1)
        self.repeats = n

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def spread(self) -> str:
        return f"{min(self.samples):.0f}-{max(self.samples):.0f}"


def c_runner(exe: Path, x: np.ndarray) -> Callable[[int], float]:
    inp = exe.parent / "in.bin"
    x.astype("<f4").tofile(inp)

    def run(n: int) -> float:
        proc = subprocess.run([str(exe), str(inp), str(exe.parent / "out.bin"), str(n)], capture_output=True,
                              text=True, check=True)
        found = re.search(r"([\d.]+) us per inference", proc.stderr)
        assert found is not None, proc.stderr
        return float(found.group(1))

    return run


def ort_runner(model: Path, x: np.ndarray) -> Callable[[int], float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.read_bytes(), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(5):
        sess.run(None, feed)

    def run(n: int) -> float:
        start = time.process_time()
        for _ in range(n):
            sess.run(None, feed)
        return (time.process_time() - start) / n * 1e6

    return run


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def nnablart_runner(binary: str, nnb: Path, workdir: Path) -> Callable[[int], float]:
    """CPU time of `nnablart infer` minus `nnablart dump` (same file loaded), per process."""
    from qcc.backends.nnb.format import DataType, payload_size, read_nnb

    parsed = read_nnb(nnb.read_bytes(), str(nnb))
    paths = []
    rng = np.random.default_rng(1)
    for i, index in enumerate(parsed.inputs):
        var = parsed.variables[index]
        count = int(np.prod(var.shape))
        data = rng.standard_normal(count).astype("<f4").tobytes() if var.dtype == DataType.FLOAT else \
            rng.integers(-20, 20, payload_size(var.dtype, count), dtype=np.int8).tobytes()
        path = workdir / f"{nnb.stem}_in{i}.bin"
        path.write_bytes(data)
        paths.append(str(path))
    infer = [binary, "infer", str(nnb), *paths, str(workdir / f"{nnb.stem}_out")]
    dump = [binary, "dump", str(nnb)]

    def per_process(cmd: list[str], n: int) -> float:
        start = children_cpu()
        for _ in range(n):
            subprocess.run(cmd, capture_output=True, check=True)
        return (children_cpu() - start) / n * 1e6

    def run(n: int) -> float:
        return max(per_process(infer, n) - per_process(dump, n), 0.0)

    return run


def callgrind(cmd: list[str]) -> int | None:
    """Instructions executed by `cmd` (valgrind --tool=callgrind), None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", *cmd],
                              capture_output=True, text=True)
        found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr) or re.search(r"refs:\s*([\d,]+)", proc.stderr)
        return int(found.group(1).replace(",", "")) if found else None


# ---------------------------------------------------------------- building


def build(directory: Path, arch: str | None, label: str) -> Path:
    """`make` with the Makefile's portable default, or with ARCH_FLAGS; the executable, copied to
    `model_<label>`."""
    subprocess.run(["make", "-s", "-C", str(directory), "clean"], check=True, capture_output=True)
    args = ["make", "-s", "-C", str(directory)] + ([f"ARCH_FLAGS={arch}"] if arch else [])
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"make failed in {directory}: {proc.stderr[-2000:]}")
    exe = directory / f"model_{label}"
    shutil.copy(directory / "model", exe)
    return exe


def native_has_dot8() -> bool:
    """-march=native targets an 8-bit dot-product instruction (x86 VNNI, Arm DOTPROD): the native
    build then takes target c's isa=dot8."""
    macros = subprocess.run(["gcc", "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True,
                            text=True).stdout
    return any(m in macros for m in ("__AVX512VNNI__", "__AVXVNNI__", "__ARM_FEATURE_DOTPROD"))


def object_bytes(directory: Path, arch: str | None) -> int:
    """text + data of the model's object file (weights are in .rodata, counted in text)."""
    c_file = next(p for p in directory.glob("*.c") if p.name != "main.c")
    obj = directory / "size_probe.o"
    flags = ["-std=c99", "-O3", *(arch.split() if arch else [])]
    subprocess.run(["gcc", *flags, "-c", "-o", str(obj), str(c_file)], check=True)
    out = subprocess.run(["size", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines()[1]
    text, data = (int(v) for v in out.split()[:2])
    return text + data


def arena_bytes(directory: Path) -> int:
    header = next(p for p in directory.glob("*.h")).read_text()
    found = re.search(r"_ARENA_SIZE (\d+)", header)
    return int(found.group(1)) if found else 0


# ---------------------------------------------------------------- one model


def find_nnablart() -> str | None:
    from tests.nnb_util import nnablart

    return nnablart()


def calibration(src: Path, calib: Path | None, tmp: Path, name: str, shape: tuple[int, ...], input_name: str) -> Path:
    if calib is not None:
        return calib
    path = tmp / f"{name}_calib.npz"
    data = np.random.default_rng(0).standard_normal((4, *shape[1:])).astype(np.float32)
    np.savez(path, **{input_name: data})
    return path


def prepare(name: str, modes: list[str], tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Compile everything for one model; the variants to time and the static numbers."""
    import qcc.driver
    from qcc.errors import QccError

    source = model_source(name, tmp)
    src, bind = source.path, shape_options(source)
    model = qcc.driver.load(str(src), **bind)
    shape = tuple(d if isinstance(d, int) else 1 for d in model.graph.inputs[0].type.shape)
    x = source.sample if source.sample is not None else \
        np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    calib = calibration(src, source.calib, tmp, name, shape, model.graph.inputs[0].name)
    onnx_float = float_onnx(src, tmp, name)
    qdq = tmp / f"{name}_qdq.onnx"
    qcc.driver.compile(str(src), qdq, target="onnx-qdq", quantize="int8", calib=str(calib), **bind)
    variants = {"ort_float": Variant(f"{name} ORT float", ort_runner(onnx_float, x)),
                "ort_qdq": Variant(f"{name} ORT QDQ int8", ort_runner(qdq, x))}
    static: dict[str, Any] = {}
    binary = find_nnablart()
    for mode in modes:
        scheme = SCHEMES[mode]
        out = tmp / f"{name}_{mode}"
        try:
            qcc.driver.compile(str(src), out, target="c", quantize=scheme,
                               calib=None if scheme == "none" else str(calib), **bind)
        except QccError as exc:  # e.g. an op without a bit-exact fixed-point kernel: no C column for that mode
            print(f"{name} C {mode}: {exc}", file=sys.stderr)
            static[mode] = {"refused": str(exc).split(": ")[-1][:80]}
            continue
        portable, native = build(out, None, "portable"), build(out, NATIVE, "native")
        variants[f"c_{mode}_portable"] = Variant(f"{name} C {mode} portable", c_runner(portable, x))
        static[mode] = {"bytes_portable": object_bytes(out, None), "bytes_native": object_bytes(out, NATIVE),
                        "arena": arena_bytes(out)}
        if scheme in AFFINE and native_has_dot8():  # native: the uint8 x int8 dot products, isa=portable beside
            variants[f"c_{mode}_native_isa_portable"] = Variant(f"{name} C {mode} native isa=portable",
                                                               c_runner(native, x))
            out = tmp / f"{name}_{mode}_dot8"
            qcc.driver.compile(str(src), out, target="c{isa=dot8}", quantize=scheme, calib=str(calib), **bind)
            native = build(out, NATIVE, "native")
            static[mode]["bytes_native"] = object_bytes(out, NATIVE)
        variants[f"c_{mode}_native"] = Variant(f"{name} C {mode} native", c_runner(native, x))
        if args.callgrind:
            avx2 = build(out, "-O3 -mavx2 -mfma", "avx2")
            inp = out / "in.bin"
            x.astype("<f4").tofile(inp)
            static[mode]["ir_portable"] = callgrind([str(portable), str(inp), str(out / "cg.bin")])
            static[mode]["ir_avx2"] = callgrind([str(avx2), str(inp), str(out / "cg.bin")])
        if binary is not None and mode in ("float32", "fixed8", "fixed16"):
            nnb = tmp / f"{name}_{mode}.nnb"
            try:
                qcc.driver.compile(str(src), nnb, quantize=scheme, calib=None if scheme == "none" else str(calib),
                                   **bind)
            except Exception as exc:  # a model the .nnb target refuses: no nnablart column
                print(f"{name} {mode}: no .nnb ({exc})", file=sys.stderr)
                continue
            variants[f"nnablart_{mode}"] = Variant(f"{name} nnablart {mode}", nnablart_runner(binary, nnb, tmp))
            if args.callgrind:
                work = tmp / f"cg_{name}_{mode}"
                work.mkdir(exist_ok=True)
                nnablart_runner(binary, nnb, work)  # writes the inputs
                inputs = sorted(str(p) for p in work.glob(f"{nnb.stem}_in*.bin"))
                infer = callgrind([binary, "infer", str(nnb), *inputs, str(work / "o")])
                dump = callgrind([binary, "dump", str(nnb)])
                static[mode]["ir_nnablart"] = None if infer is None or dump is None else infer - dump
    return {"variants": variants, "static": static}


# ---------------------------------------------------------------- running and reporting


def pin(cpu: int | None) -> str:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return "not pinned"
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def measure(prepared: dict[str, dict[str, Any]], rounds: int, budget: float) -> None:
    variants = [v for p in prepared.values() for v in p["variants"].values()]
    for v in variants:
        v.calibrate(budget)
    for r in range(rounds):
        for v in variants if r % 2 == 0 else reversed(variants):
            v.samples.append(v.run(v.repeats))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)


def ratio(a: Variant | None, b: Variant | None) -> str:
    return f"{a.median / b.median:.2f}" if a is not None and b is not None and b.median > 0 else "-"


def cell(v: Variant | None) -> str:
    return f"{v.median:.0f} ({v.spread()})" if v is not None else "-"


def report(prepared: dict[str, dict[str, Any]], modes: list[str], args: argparse.Namespace, pinned: str,
           loads: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    import onnxruntime

    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else ""
    lines = [
        HEADING,
        "",
        f"`bench/bench_c.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d')}, {cpu} ({platform.machine()}, "
        f"{os.cpu_count()} CPUs), {gcc}, onnxruntime {onnxruntime.__version__}; {pinned}. Latency: CPU time per "
        f"inference in microseconds, median of {args.rounds} interleaved rounds (min-max), each round a batch of "
        f">= {args.batch_s} s. C portable = the Makefile's default (`-std=c99 -O3`, no instruction-set flag); "
        f"C native = `ARCH_FLAGS=\"{NATIVE}\"`, affine modes generated with `--target c{{isa=dot8}}` where the "
        "native instruction set has an 8-bit dot product (VNNI; the int16 products of the default `isa=portable`, "
        "built native, beside them). ORT: 1 thread, all graph optimizations; QDQ = qcc's "
        "`--target onnx-qdq --quantize int8`. nnablart = nnabla-c-runtime's `nnablart infer` on qcc's .nnb of "
        "the same model (float for float32, fixed8 for fixed8; CPU time of infer minus dump). Load average "
        f"(1/5/15 min) before: {'/'.join(f'{v:.1f}' for v in loads[0])}, after: "
        f"{'/'.join(f'{v:.1f}' for v in loads[1])}.",
        "",
        "| model | C mode | C native (us) | C native isa=portable (us) | C portable (us) | ORT float (us) | ORT QDQ int8 (us) | nnablart (us) "
        "| native / ORT float | portable / ORT float | native / ORT QDQ | nnablart / C native | code native / "
        "portable (B) | arena (B) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in prepared.items():
        vs = p["variants"]
        for mode in modes:
            native, portable = vs.get(f"c_{mode}_native"), vs.get(f"c_{mode}_portable")
            nnab = vs.get(f"nnablart_{mode}")
            st = p["static"].get(mode, {})
            lines.append(
                f"| {name} | {mode} | {cell(native) if 'refused' not in st else 'refused: ' + st['refused']} "
                f"| {cell(vs.get(f'c_{mode}_native_isa_portable'))} | {cell(portable)} | {cell(vs['ort_float'])} "
                f"| {cell(vs['ort_qdq'])} | {cell(nnab)} | {ratio(native, vs['ort_float'])} "
                f"| {ratio(portable, vs['ort_float'])} | {ratio(native, vs['ort_qdq'])} | {ratio(nnab, native)} "
                f"| {st.get('bytes_native', '-')} / {st.get('bytes_portable', '-')} | {st.get('arena', '-')} |")
    if args.callgrind:
        lines += ["", "Instructions per inference (valgrind callgrind; load-independent):", "",
                  "| model | C mode | C portable | C -O3 -mavx2 -mfma | nnablart (infer - dump) | nnablart / C avx2 |",
                  "|---|---|---:|---:|---:|---:|"]
        for name, p in prepared.items():
            for mode in modes:
                st = p["static"].get(mode, {})
                nn, av = st.get("ir_nnablart"), st.get("ir_avx2")
                lines.append(f"| {name} | {mode} | {st.get('ir_portable') or '-'} | {av or '-'} | {nn or '-'} "
                             f"| {f'{nn / av:.1f}' if nn and av else '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["digits", "resnet23", "squeezenet", "shufflenet"])
    parser.add_argument("--corpus", nargs="*", default=[], help="model names bench/corpus.py provides")
    parser.add_argument("--modes", nargs="+", default=["float32", "int8", "fixed8"], choices=list(SCHEMES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-s", type=float, default=0.3, help="seconds per timed batch")
    parser.add_argument("--cpu", type=int, default=1 if (os.cpu_count() or 1) > 1 else None)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    pinned = pin(args.cpu)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        prepared = {}
        for name in [*args.models, *args.corpus]:
            work = tmp / name
            work.mkdir()
            prepared[name] = prepare(name, args.modes, work, args)
        measure(prepared, args.rounds, args.batch_s)
        section = report(prepared, args.modes, args, pinned, (before, os.getloadavg()))
    print(section)
    if args.record:
        from bench.doc_section import replace_section

        replace_section(HEADING, section, args.record)


if __name__ == "__main__":
    main()
