"""Seed 000 with qcc: add a quantization layer after every ReLU, AveragePooling and Affine.

The nnabla way (seed 000) rebuilds each consumer after a PF.min_max_quantize and `rewire_on`s it.
With qcc it is one `insert_after` per tensor: import the .nnp, insert a Quantize node after each
chosen output (every consumer is rewired), and write an .nnp that nnabla loads and runs, where
each Quantize is a MinMaxQuantize (ql 0..255, range from x's min/max like the seed's).

    python examples/nnabla_quantize_layers/quantize_layers.py [--out DIR] [--size 224]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mobilenet_v1 import save_mobilenet_v1

# nnabla function types of seed 000 -> the IR ops qcc imports them as
QUANTIZE_AFTER = {"ReLU": "Relu", "AveragePooling": "AvgPool", "Affine": "Dense"}


def function_sequence(path: Path, size: int) -> tuple[list[str], np.ndarray]:
    """Functions in `y.visit` order (what seed 000 prints) and the output, as nnabla loads the file."""
    import nnabla as nn
    from nnabla.utils.nnp_graph import NnpLoader

    nn.clear_parameters()
    nnp = NnpLoader(str(path))
    net = nnp.get_network(nnp.get_network_names()[0], batch_size=1)
    (x,) = net.inputs.values()
    (y,) = net.outputs.values()
    x.d = np.random.RandomState(0).uniform(0, 255, (1, 3, size, size))
    y.forward(clear_buffer=True)
    names: list[str] = []
    y.visit(lambda f: names.append(f.info.type_name))
    return names, np.array(y.d, copy=True)


def add_quantize_layers(model: Any) -> int:
    """Insert a Quantize after the output of every node of the chosen ops; returns how many."""
    from qcc.ir.surgery import insert_after

    targets = [node.outputs[0] for node in model.graph.nodes if node.op in QUANTIZE_AFTER.values()]
    for value in targets:
        insert_after(model.graph, value, "Quantize", {"label": "MinMaxQuantize"})
    return len(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the .nnp files (default: a temporary one)")
    parser.add_argument("--size", type=int, default=224, help="input height/width (224 as in the seed)")
    args = parser.parse_args(argv)

    from qcc.backends.nnp import BACKEND as NNP

    from qcc.frontends.nnp import load_nnp

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        original, quantized = out / "mobilenet_v1.nnp", out / "mobilenet_v1_quantized.nnp"
        save_mobilenet_v1(original, seed=0, size=args.size)
        model = load_nnp(original)
        count = add_quantize_layers(model)
        NNP.write(model, quantized)

        before, y_float = function_sequence(original, args.size)
        after, y_quant = function_sequence(quantized, args.size)
        print("----- before -----")
        print("\n".join(before))
        print()
        print("----- after -----")
        print("\n".join(after))
        print()
        print(f"inserted {count} MinMaxQuantize ({after.count('MinMaxQuantize')} in the written .nnp); "
              f"top-1 class float {int(y_float.argmax())}, quantized {int(y_quant.argmax())}; "
              f"max |y - y_q| = {float(np.abs(y_float - y_quant).max()):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
