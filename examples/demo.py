"""The main job on the bundled example: compile the digits CNN for every available target.

For each target it prints what was done, the accuracy on the held-out digits (through the
target's own runtime where one is installed, else through qcc's simulator of that target) and
the memory it needs. Run it with `bash scripts/dev demo`. The accuracy is what `--eval` measured by
running the written file in its target's runtime; the runners below do the same by hand (the
tests check the two agree).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DIGITS = HERE / "digits"


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean())


def ort_logits(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0])


def c_logits(out_dir: Path, x: np.ndarray) -> np.ndarray:
    """Build the generated C with its Makefile and run ./model once per image (the real binary)."""
    import subprocess

    subprocess.run(["make", "-s", "-C", str(out_dir)], check=True, capture_output=True)
    rows = []
    for image in x:
        (out_dir / "in.bin").write_bytes(np.ascontiguousarray(image[None], dtype="<f4").tobytes())
        subprocess.run([str(out_dir / "model"), str(out_dir / "in.bin"), str(out_dir / "out.bin")], check=True)
        rows.append(np.fromfile(out_dir / "out.bin", dtype="<f4"))
    return np.stack(rows)


def nnb_logits(path: Path, x: np.ndarray) -> tuple[np.ndarray, str]:
    """nnabla-c-runtime when a built `nnablart` is around (QCC_NNABLART or PATH), else qcc's
    emulation of the decoded file (the same bit-exact kernels the tests check against nnablart)."""
    import os
    import shutil
    import subprocess

    from qcc.backends.nnb.format import read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    from qcc.sim import run_model

    nnb = read_nnb(path.read_bytes(), str(path))
    runtime = os.environ.get("QCC_NNABLART") or shutil.which("nnablart")
    if runtime:  # files in the variables' types: float32, or int8/int16 at their fixed-point position
        xin, out = nnb.variables[nnb.inputs[0]], nnb.variables[nnb.outputs[0]]
        rows = []
        work = path.parent
        for image in x:
            if xin.dtype.name == "FLOAT":
                raw = np.ascontiguousarray(image[None], dtype="<f4")
            else:  # round half to even and saturate, as qcc quantizes a graph input
                lo, hi = (-128, 127) if xin.dtype.name == "INT8" else (-32768, 32767)
                raw = np.clip(np.rint(np.ldexp(image[None].astype(np.float32), xin.fp_pos)), lo, hi)
                raw = raw.astype("i1" if xin.dtype.name == "INT8" else "<i2")
            (work / "in.bin").write_bytes(raw.tobytes())
            subprocess.run([runtime, "infer", str(path), str(work / "in.bin"), str(work / "nnb_out")], check=True,
                           capture_output=True)
            data = (work / "nnb_out_0.bin").read_bytes()
            if out.dtype.name == "FLOAT":
                rows.append(np.frombuffer(data, "<f4"))
            else:
                ints = np.frombuffer(data, "i1" if out.dtype.name == "INT8" else "<i2")
                rows.append(np.ldexp(ints.astype(np.float32), -out.fp_pos))
        return np.stack(rows), "nnabla-c-runtime"
    model = lift_nnb(nnb)
    return next(iter(run_model(model, {model.graph.inputs[0].name: x}, quantized=True).values())), \
        "qcc emulation of the .nnb"


def file_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


JOBS: list[dict[str, Any]] = [
    {"label": "ONNX float", "target": "onnx", "out": "digits.onnx", "quantize": "none"},
    {"label": "ONNX QDQ int8", "target": "onnx-qdq", "out": "digits_int8.onnx", "quantize": "int8"},
    {"label": "ONNX QDQ fixed8", "target": "onnx-qdq", "out": "digits_fixed8.onnx", "quantize": "fixed8"},
    {"label": ".nnb float", "target": "nnb", "out": "digits.nnb", "quantize": "none"},
    {"label": ".nnb FIXED16", "target": "nnb", "out": "digits_fixed16.nnb", "quantize": "fixed16"},
    {"label": ".nnb FIXED8", "target": "nnb", "out": "digits_fixed8.nnb", "quantize": "fixed8"},
    {"label": "C float", "target": "c", "out": "digits_c_float", "quantize": "none"},
    {"label": "C fixed16", "target": "c", "out": "digits_c_fixed16", "quantize": "fixed16"},
    {"label": "C fixed8", "target": "c", "out": "digits_c_fixed8", "quantize": "fixed8"},
    {"label": "C int8", "target": "c", "out": "digits_c_int8", "quantize": "int8"},
    {"label": ".nnp float", "target": "nnp", "out": "digits.nnp", "quantize": "none"},
]


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING)  # keep framework INFO lines out of the table
    import qcc.driver
    from qcc.errors import QccError
    from qcc.plugins import registry

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="output folder (default: a temporary one)")
    args = parser.parse_args(argv)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="qcc-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    test = np.load(DIGITS / "test.npz")
    x, labels = test["x"], test["labels"]
    float_acc = accuracy(ort_logits(DIGITS / "digits_cnn.onnx", x), labels)
    print(f"qcc demo: {DIGITS / 'digits_cnn.onnx'} (digits CNN, {len(labels)} test images)")
    print(f"  float accuracy in onnxruntime: {float_acc:.4f}")
    print(f"  outputs in {out_dir}\n")
    targets = set(registry().names("backend"))
    rows = []
    for job in JOBS:
        if job["target"] not in targets:
            rows.append((job["label"], "-", "-", "-", "-", "target not available in this build"))
            continue
        out = out_dir / job["out"]
        start = time.perf_counter()
        try:
            _, report = qcc.driver.compile(
                DIGITS / "digits_cnn.onnx", out, target=job["target"], quantize=job["quantize"],
                calib=str(DIGITS / "calib.npz") if job["quantize"] != "none" else None,
                eval=str(DIGITS / "test.npz"))
        except QccError as exc:
            rows.append((job["label"], "-", "-", "-", "-", f"failed: {exc}"))
            continue
        seconds = time.perf_counter() - start
        size = file_bytes(out)
        # --eval ran the written file in its target's runtime (onnxruntime, the gcc-built program,
        # nnablart or the decoded .nnb, nnabla); tests/test_issue16_eval.py checks those numbers
        # against the runners above
        measured = report["eval"].get("runtime")
        if measured:
            acc, how = measured["accuracy"], measured["name"].split(" (")[0]
        else:
            acc, how = report["eval"]["quantized_accuracy"], "qcc simulator"
        memory = report.get("memory", {})
        # what the target allocates: the .nnb runtime's buffers as written, else the planned arena
        ram = (report.get("nnb", {}).get("buffer_bytes") or memory.get("arena_bytes")
               or memory.get("shared_objects_bytes") or "-")
        rows.append((job["label"], f"{acc:.4f}", how, str(size), str(ram), f"{seconds:.2f}s"))
    header = ("target", "accuracy", "measured in", "output bytes", "RAM bytes", "compile")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
