"""Where FIXED8 loses a corpus model's signal: the .nnb arithmetic against variants of it.

For one model of bench/corpus.py (its cached archive, its calibration and evaluation inputs), the
SQNR of the outputs against onnxruntime's float run, each row changing one thing:

- fixed8 .nnb: qcc.sim.fixed, bit-exact with nnablart (the corpus's .nnb column);
- same positions, float kernels, truncating stores: no per-input-channel truncation in Conv;
- same positions, float kernels, stores rounded half to even: no truncation at all;
- fixed8 positions for a rounding runtime (onnx-qdq rules: no product limit, no shared Add
  positions), rounded stores;
- fixed16 .nnb (qcc.sim.fixed).

    python bench/fixed8_limits.py --model ppocr-cls [--calib 16 --eval 12]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import corpus as C
from bench.corpus_models import MODELS


def outputs(model: Any, runner: Any, feeds: dict[str, np.ndarray], corpus_model: Any) -> np.ndarray:
    results = (runner.run(C.per_sample(feeds, corpus_model, i)) for i in range(C.count_of(feeds, corpus_model)))
    return C.flat([[r[v.name] for v in model.graph.outputs] for r in results])


def main() -> None:
    import qcc
    from qcc.ir.types import FixedPoint
    from qcc.sim.fixed import FixedRunner
    from qcc.sim.interpreter import Interpreter

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ppocr-cls", help=",".join(m.key for m in MODELS))
    parser.add_argument("--calib", type=int, default=16)
    parser.add_argument("--eval", type=int, default=12)
    args = parser.parse_args()
    cm = next(m for m in MODELS if m.key == args.model)
    skwheel = C.archive(C.IMAGES)
    path = C.model_file(cm)
    calib = C.samples(cm, path, args.calib, 0, skwheel)
    feeds = C.samples(cm, path, args.eval, 1000, skwheel)
    shapes = C.flag_shapes(path, cm)
    ref = C.flat(C.ort_outputs(path, feeds, cm))
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.savez(work / "calib.npz", **calib)

        def compiled(out: str, scheme: str) -> Any:
            return qcc.compile(path, work / out, quantize=scheme, calib=str(work / "calib.npz"),
                               input_shapes=shapes)[0]

        nnb8 = compiled("m8.nnb", "fixed8")
        rows.append(("fixed8 .nnb (qcc.sim.fixed = nnablart)", C.sqnr(outputs(nnb8, FixedRunner(nnb8), feeds, cm), ref)))
        trunc = Interpreter(nnb8, quantized=True)
        rows.append(("same positions, float kernels, truncating stores", C.sqnr(outputs(nnb8, trunc, feeds, cm), ref)))
        for v in nnb8.graph.values():
            if isinstance(v.quant, FixedPoint):
                v.quant = attrs.evolve(v.quant, rounding="half_even")
        rounded = Interpreter(nnb8, quantized=True)
        rows.append(("same positions, float kernels, rounded stores", C.sqnr(outputs(nnb8, rounded, feeds, cm), ref)))
        qdq8 = compiled("m8.onnx", "fixed8")
        rows.append(("fixed8 for a rounding runtime (onnx-qdq rules)",
                     C.sqnr(outputs(qdq8, Interpreter(qdq8, quantized=True), feeds, cm), ref)))
        nnb16 = compiled("m16.nnb", "fixed16")
        rows.append(("fixed16 .nnb (qcc.sim.fixed)", C.sqnr(outputs(nnb16, FixedRunner(nnb16), feeds, cm), ref)))
    print(f"| {cm.key}: variant | output SQNR vs onnxruntime float |\n|---|---|")
    for label, db in rows:
        print(f"| {label} | {db:.1f} dB |")


if __name__ == "__main__":
    main()
