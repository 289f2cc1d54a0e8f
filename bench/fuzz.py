"""Mutation campaign against qcc's readers: every case must end in success or a clean QccError.

Usage: python bench/fuzz.py --reader onnx|nnp|nnb|yaml|npz --cases N [--seed S] [--timeout SEC]

Cases are truncations, byte flips, splices and structure-aware edits (ONNX: negative/huge dims,
dangling inputs, cycles, wrong types; archives: zip-slip and zip-bomb members). Each case runs in
a worker process with a time limit and is counted as `clean` (a qcc error), `ok` (read fine),
`crash` (any other exception, or the worker died from a signal) or `hang` (time limit).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- seeds
def _digits_onnx() -> bytes:
    return (ROOT / "examples" / "digits" / "digits_cnn.onnx").read_bytes()


def onnx_seeds() -> list[bytes]:
    from tests.onnx_zoo import light_path

    return [_digits_onnx(), light_path("squeezenet").read_bytes()]


def npz_seeds() -> list[bytes]:
    return [(ROOT / "examples" / "digits" / "calib.npz").read_bytes(),
            (ROOT / "examples" / "digits" / "test.npz").read_bytes()]


def _nnp_from_digits() -> bytes:
    import qcc.driver

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "d.nnp"
        qcc.driver.compile(ROOT / "examples" / "digits" / "digits_cnn.onnx", out, target="nnp")
        return out.read_bytes()


def nnp_seeds() -> list[bytes]:
    return [_nnp_from_digits()]


def nnb_seeds() -> list[bytes]:
    import qcc.driver

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "d.nnb"
        qcc.driver.compile(ROOT / "examples" / "digits" / "digits_cnn.onnx", out, target="nnb")
        return [out.read_bytes()]


def yaml_seeds() -> list[bytes]:
    from qcc.frontends.onnx import load_onnx
    from qcc.settings_yaml import export_settings

    return [export_settings(load_onnx(ROOT / "examples" / "digits" / "digits_cnn.onnx")).encode()]


# ----------------------------------------------------------------------------- mutations
def byte_mutation(rng: random.Random, data: bytes) -> bytes:
    kind = rng.choice(("truncate", "flip", "flips", "splice", "insert", "zero", "ff"))
    buf = bytearray(data)
    if not buf:
        return bytes(rng.randbytes(rng.randint(1, 64)))
    if kind == "truncate":
        return bytes(buf[: rng.randrange(len(buf))])
    if kind == "flip":
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 32)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "splice":
        a, b = sorted(rng.randrange(len(buf)) for _ in range(2))
        c = rng.randrange(len(buf))
        buf[c:c] = buf[a:b]
    elif kind == "insert":
        i = rng.randrange(len(buf))
        buf[i:i] = rng.randbytes(rng.randint(1, 16))
    elif kind == "zero":
        i = rng.randrange(len(buf))
        buf[i:i + rng.randint(1, 64)] = bytes(min(64, len(buf) - i))
    else:
        i = rng.randrange(len(buf))
        buf[i:i + 8] = b"\xff" * min(8, len(buf) - i)
    return bytes(buf)


def onnx_structural(rng: random.Random, data: bytes) -> bytes:
    import onnx

    model = onnx.load_from_string(data)
    g = model.graph
    kind = rng.choice(("dim", "dangling", "cycle", "dtype", "attr", "opset", "drop_init", "dup_output"))
    if kind == "dim" and (g.input or g.initializer):
        if g.initializer and rng.random() < 0.5:
            t = rng.choice(list(g.initializer))
            if t.dims:
                t.dims[rng.randrange(len(t.dims))] = rng.choice((-1, 0, 2**40, 10**12, 3))
        else:
            dims = g.input[0].type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = rng.choice((0, 2**40, 10**12, 7))
    elif kind == "dangling" and g.node:
        n = rng.choice(list(g.node))
        if n.input:
            n.input[rng.randrange(len(n.input))] = "no_such_tensor"
    elif kind == "cycle" and len(g.node) > 2:
        a, b = rng.sample(range(len(g.node)), 2)
        if g.node[a].input and g.node[b].output:
            g.node[min(a, b)].input[0] = g.node[max(a, b)].output[0]
    elif kind == "dtype" and g.initializer:
        rng.choice(list(g.initializer)).data_type = rng.choice((2, 3, 6, 7, 9, 10, 11, 16, 99))
    elif kind == "attr" and g.node:
        n = rng.choice(list(g.node))
        if n.attribute:
            a = rng.choice(list(n.attribute))
            if a.ints:
                a.ints[rng.randrange(len(a.ints))] = rng.choice((-5, 0, 2**31, -(2**40)))
            elif a.HasField("i"):
                a.i = rng.choice((-5, 0, 2**31))
            elif a.HasField("f"):
                a.f = rng.choice((float("nan"), float("inf"), -1.0))
    elif kind == "opset":
        model.opset_import[0].version = rng.choice((1, 8, 22, 999))
    elif kind == "drop_init" and g.initializer:
        del g.initializer[rng.randrange(len(g.initializer))]
    elif kind == "dup_output" and len(g.node) > 1:
        g.node[1].output[0] = g.node[0].output[0]
    return bytes(model.SerializeToString())


def zip_structural(rng: random.Random, data: bytes) -> bytes:
    """Zip-slip, zip-bomb, member swaps and corrupted members inside a valid archive."""
    src = zipfile.ZipFile(io.BytesIO(data))
    members = [(i.filename, src.read(i.filename)) for i in src.infolist()]
    out = io.BytesIO()
    kind = rng.choice(("slip", "absolute", "bomb", "many", "drop", "corrupt_member"))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, payload in members:
            if kind == "drop" and rng.random() < 0.5:
                continue
            if kind == "corrupt_member" and rng.random() < 0.5:
                payload = byte_mutation(rng, payload)
            zf.writestr(name, payload)
        if kind == "slip":
            zf.writestr("../../evil_" + str(rng.randrange(1000)), b"owned")
        elif kind == "absolute":
            zf.writestr("/tmp/evil_abs", b"owned")
        elif kind == "bomb":
            zf.writestr(members[0][0] + ".bomb" if members else "bomb", b"\0" * (64 * 1024 * 1024))
        elif kind == "many":
            for i in range(rng.choice((100, 20000))):
                zf.writestr(f"m{i}", b"")
    return out.getvalue()


def yaml_structural(rng: random.Random, data: bytes) -> bytes:
    text = data.decode()
    edits = ["!!python/object/apply:os.system ['echo owned']", "FIXED99_3", "FIXED8_-4", "[1, 2]", "{a: b}",
             "&a [*a]", "FIXED16_77", "SIGN", "'\x00'", "FLOAT64"]
    lines = text.splitlines()
    if lines:
        i = rng.randrange(len(lines))
        if ":" in lines[i]:
            key = lines[i].split(":")[0]
            lines[i] = f"{key}: {rng.choice(edits)}"
        else:
            lines[i] = rng.choice(edits)
    if rng.random() < 0.2:
        lines.append("unknown_tensor_name: FIXED8_3")
    return "\n".join(lines).encode()


# ----------------------------------------------------------------------------- readers
def _write(data: bytes, suffix: str, tmp: str) -> str:
    path = os.path.join(tmp, "case" + suffix)
    with open(path, "wb") as f:
        f.write(data)
    return path


def read_onnx(path: str) -> None:
    from qcc.frontends.onnx import load_onnx

    load_onnx(path)


def read_npz(path: str) -> None:
    from qcc.data import bind_inputs, load_npz
    from qcc.frontends.onnx import load_onnx

    model = _cached("digits", lambda: load_onnx(ROOT / "examples" / "digits" / "digits_cnn.onnx"))
    bind_inputs(model, load_npz(path), path)


def read_nnp(path: str) -> None:
    import qcc.driver

    qcc.driver.load(path)


def read_nnb(path: str) -> None:
    from qcc.inspect import inspect_path

    with open(os.devnull, "w") as sink:
        old, sys.stdout = sys.stdout, sink
        try:
            inspect_path(path, as_json=True)
        finally:
            sys.stdout = old


def read_yaml(path: str) -> None:
    from qcc.frontends.onnx import load_onnx
    from qcc.settings_yaml import apply_settings

    model = load_onnx(ROOT / "examples" / "digits" / "digits_cnn.onnx")
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="strict")
    apply_settings(model, text, path)


_CACHE: dict[str, Any] = {}


def _cached(key: str, make: Callable[[], Any]) -> Any:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


READERS: dict[str, dict[str, Any]] = {
    "onnx": {"seeds": onnx_seeds, "read": read_onnx, "suffix": ".onnx", "structural": onnx_structural},
    "npz": {"seeds": npz_seeds, "read": read_npz, "suffix": ".npz", "structural": zip_structural},
    "nnp": {"seeds": nnp_seeds, "read": read_nnp, "suffix": ".nnp", "structural": zip_structural},
    "nnb": {"seeds": nnb_seeds, "read": read_nnb, "suffix": ".nnb", "structural": None},
    "yaml": {"seeds": yaml_seeds, "read": read_yaml, "suffix": ".yaml", "structural": yaml_structural},
}


# ----------------------------------------------------------------------------- worker
class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _worker(reader: str, timeout: float, tasks: Any, results: Any, scratch: str) -> None:
    from qcc.errors import QccError

    signal.signal(signal.SIGALRM, _alarm)
    spec = READERS[reader]
    os.chdir(scratch)
    while True:
        item = tasks.get()
        if item is None:
            return
        index, data = item
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            path = _write(data, spec["suffix"], tmp)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                spec["read"](path)
                outcome, detail = "ok", ""
            except _Timeout:
                outcome, detail = "hang", ""
            except QccError as exc:
                outcome, detail = "clean", str(exc)[:200]
            except MemoryError:
                outcome, detail = "crash", "MemoryError"
            except BaseException as exc:
                outcome, detail = "crash", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        results.put((index, outcome, detail))


def make_cases(reader: str, count: int, seed: int) -> list[bytes]:
    spec = READERS[reader]
    seeds = spec["seeds"]()
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        base = rng.choice(seeds)
        structural = spec["structural"]
        try:
            if structural is not None and rng.random() < 0.4:
                data = structural(rng, base)
                if rng.random() < 0.3:
                    data = byte_mutation(rng, data)
            else:
                data = byte_mutation(rng, base)
        except Exception:  # a mutation that cannot apply to this seed: use a byte mutation
            data = byte_mutation(rng, base)
        cases.append(data)
    return cases


def run_campaign(reader: str, count: int, seed: int, timeout: float = 10.0, workers: int = 2,
                 verbose: bool = True) -> dict[str, Any]:
    cases = make_cases(reader, count, seed)
    counts: Counter[str] = Counter()
    findings: list[tuple[int, str, str]] = []
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        pending = list(range(len(cases)))
        while pending:
            tasks, results = ctx.Queue(), ctx.Queue()
            procs = [ctx.Process(target=_worker, args=(reader, timeout, tasks, results, scratch), daemon=True)
                     for _ in range(workers)]
            for p in procs:
                p.start()
            for i in pending:
                tasks.put((i, cases[i]))
            for _ in procs:
                tasks.put(None)
            done: set[int] = set()
            while len(done) < len(pending):
                try:
                    index, outcome, detail = results.get(timeout=timeout * 3 + 30)
                except Exception:
                    if all(not p.is_alive() for p in procs) or any(p.exitcode not in (None, 0) for p in procs):
                        break
                    continue
                done.add(index)
                counts[outcome] += 1
                if outcome in ("crash", "hang"):
                    findings.append((index, outcome, detail))
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            for p in procs:
                p.join(timeout=1)
                if p.is_alive():
                    p.kill()
            remaining = [i for i in pending if i not in done]
            if remaining:
                # a worker died on some case (signal): count the first unfinished one as a crash
                victim = remaining[0]
                counts["crash"] += 1
                findings.append((victim, "crash", f"worker died (exit {[p.exitcode for p in dead]})"))
                remaining = remaining[1:]
            pending = remaining
        # nothing may be written outside the scratch directory by zip-slip cases
        escaped = [p for p in ("/tmp/evil_abs",) if os.path.exists(p)]
    elapsed = time.perf_counter() - start
    result = {"reader": reader, "cases": count, "seed": seed, "counts": dict(counts), "findings": findings[:20],
              "escaped_files": escaped, "seconds": round(elapsed, 1)}
    if verbose:
        print(f"{reader}: {count} cases in {elapsed:.1f}s: " +
              ", ".join(f"{k} {counts.get(k, 0)}" for k in ("ok", "clean", "crash", "hang")))
        for index, outcome, detail in findings[:20]:
            print(f"  case {index}: {outcome}: {detail}")
        if escaped:
            print(f"  files written outside the sandbox: {escaped}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reader", required=True, choices=sorted(READERS))
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    result = run_campaign(args.reader, args.cases, args.seed, args.timeout, args.workers)
    bad = result["counts"].get("crash", 0) + result["counts"].get("hang", 0) + len(result["escaped_files"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
