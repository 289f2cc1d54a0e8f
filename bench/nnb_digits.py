"""The digits example through the nnb target: accuracy and sizes for float, FIXED16, FIXED8.

    .venv/bin/python bench/nnb_digits.py [--nnablart PATH]

Each scheme is compiled with its default pipeline (`qcc compile examples/digits/digits_cnn.onnx
-o digits.nnb --quantize SCHEME --calib examples/digits/calib.npz`) and evaluated on the 360
test images three ways: qcc's simulator on the compiled model, the same simulator on the .nnb
decoded back to IR (backends/nnb/lift.py), and nnabla-c-runtime's `nnablart infer` one image at
a time when a build is given (or QCC_NNABLART / PATH has one). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qcc.backends.nnb.format import read_nnb  # noqa: E402
from qcc.backends.nnb.lift import lift_nnb  # noqa: E402

from qcc.driver import compile as qcc_compile  # noqa: E402
from qcc.sim.fixed import FixedRunner, fixed_of, quantize_round  # noqa: E402

DIGITS = ROOT / "examples" / "digits"
SCHEMES = ("none", "fixed16", "fixed8")
NP_TYPES = {0: np.float32, 1: np.int16, 2: np.int8}


def evaluate(work: Path, binary: str | None) -> list[dict[str, object]]:
    from tests.nnb_util import run_nnablart

    data = np.load(DIGITS / "test.npz")
    x, labels = data["x"], data["labels"]
    rows = []
    for scheme in SCHEMES:
        path = work / f"{scheme}.nnb"
        calib = str(DIGITS / "calib.npz") if scheme != "none" else None
        model, report = qcc_compile(str(DIGITS / "digits_cnn.onnx"), str(path), quantize=scheme, calib=calib)
        out = model.graph.outputs[0].name
        sim = FixedRunner(model).run({"x": x})[out]
        lifted = lift_nnb(read_nnb(path.read_bytes(), str(path)))
        emu = FixedRunner(lifted).run({lifted.graph.inputs[0].name: x})[lifted.graph.outputs[0].name]
        row: dict[str, object] = {
            "scheme": scheme, "sim": float(np.mean(sim.argmax(1) == labels)),
            "emulation": float(np.mean(emu.argmax(1) == labels)), "emulation_exact": bool(np.array_equal(sim, emu)),
            **{k: v for k, v in report["nnb"].items() if k in ("file_bytes", "buffer_bytes",
                                                               "nnabla_policy_buffer_bytes")},
        }  # fmt: skip
        if binary is not None:
            nnb = read_nnb(path.read_bytes(), str(path))
            fixed = fixed_of(model.graph.inputs[0])
            in_type = NP_TYPES[int(nnb.variables[nnb.inputs[0]].dtype)]
            out_var = nnb.variables[nnb.outputs[0]]
            hits = same = 0
            for i in range(len(x)):
                sample = x[i : i + 1]
                raw = quantize_round(sample, fixed).astype(in_type) if fixed is not None else sample
                (result,) = run_nnablart(binary, path, [raw], work)
                got = np.frombuffer(result, NP_TYPES[int(out_var.dtype)]).astype(np.float64)
                hits += int(got.argmax() == labels[i])
                stored = FixedRunner(model).run_stored({"x": sample})[out].reshape(-1)
                same += int(np.array_equal(got, stored) if fixed is not None else np.allclose(got, stored, atol=1e-5))
            row["nnablart"] = hits / len(x)
            row["nnablart_same"] = same / len(x)
        rows.append(row)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    has_rt = "nnablart" in rows[0]
    head = "| scheme | simulator | decoded file | nnablart | runtime = simulator | file | buffers | nnabla policy |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rt = f"{r['nnablart']:.4f}" if has_rt else "-"
        same = f"{100 * float(r['nnablart_same']):.0f}%" if has_rt else "-"  # type: ignore[arg-type]
        lines.append(f"| {r['scheme']} | {r['sim']:.4f} | {r['emulation']:.4f} | {rt} | {same} | "
                     f"{r['file_bytes']} | {r['buffer_bytes']} | {r['nnabla_policy_buffer_bytes']} |")
    return "\n".join(lines)


def main() -> None:
    from tests.nnb_util import nnablart

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnablart", help="nnablart binary (default: QCC_NNABLART, PATH)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        print(table(evaluate(Path(work), args.nnablart or nnablart())))


if __name__ == "__main__":
    main()
