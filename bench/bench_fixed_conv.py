"""The fixed-point convolution kernel (qcc.sim.fixed.conv_kernel): cost per layer, against anchors.

nnabla-c-runtime truncates each input channel's partial sum, so the simulator loops over input
channels. Anchors measured in the same run on the same layer and integers: the kernel as issue 18
left it (`issue18_conv_kernel`: float64, whole-output passes per input channel), the kernel as it was
before issue 18's port (a copy, `previous_conv_kernel`: int64 partial sums, a division per
truncation) and the float convolution of the reference interpreter (one im2col GEMM). Layers:
shapes of densenet121 (224x224 input) and mobilenet_v2 (96x96), batch 1, FIXED8 positions with
a truncating shift. Each figure is the best of --repeats rounds, interleaved; outputs are checked
equal to the previous kernel's.

`--baseline FILE` adds another checkout's qcc/sim/fixed.py (e.g. `git show main:qcc/sim/fixed.py >
/tmp/fixed_main.py`) as an anchor timed in the same rounds; `--bits 16` runs FIXED16 layers (the
float64 path: shift 15, inputs in [0, 2**15), weights in [-2**15, 2**15)); the two older anchors
are FIXED8 kernels and are left out there.

Run: .venv/bin/python bench/bench_fixed_conv.py [--repeats 5] [--baseline FILE] [--bits 16]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qcc.ir.core import Graph, Node  # noqa: E402
from qcc.ir.ops._common import windows  # noqa: E402
from qcc.ir.registry import get_schema  # noqa: E402
from qcc.ir.types import FixedPoint, TensorType  # noqa: E402
from qcc.sim.fixed import _types, conv_kernel, saturate, tdiv  # noqa: E402

LAYERS = [  # name, input channels, output channels, spatial size, kernel, group
    ("densenet 1x1, 56x56, 128 -> 128", 128, 128, 56, 1, 1),
    ("densenet 3x3, 56x56, 128 -> 32", 128, 32, 56, 3, 1),
    ("densenet 1x1, 14x14, 512 -> 128", 512, 128, 14, 1, 1),
    ("densenet 1x1, 7x7, 1024 -> 128", 1024, 128, 7, 1, 1),
    ("mobilenet_v2 1x1, 12x12, 64 -> 384", 64, 384, 12, 1, 1),
    ("mobilenet_v2 depthwise 3x3, 12x12, 384", 384, 384, 12, 3, 384),
    ("mobilenet_v2 1x1, 3x3, 960 -> 320", 960, 320, 3, 1, 1),
]


def _geometry(node: Node, args: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(input windows N, C, OH, OW, KH, KW; weights; the truncating shift; the output's bits)."""
    (fx, fw, *_), fy = _types(node)
    x, w = args[0], args[1]
    pads = node.attrs["pads"]
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    win = windows(xp, w.shape[2:], node.attrs["strides"], node.attrs["dilations"])
    return win, w, fx.frac + fw.frac - fy.frac, fy.bits


def previous_conv_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """qcc.sim.fixed.conv_kernel before the port (bias omitted: the layers here have none)."""
    win, w, n, bits = _geometry(node, args)
    group = node.attrs["group"]
    batch, _, oh, ow, kh, kw = win.shape
    o, cg = w.shape[:2]
    og = o // group
    wf = w.astype(np.float64).reshape(group, og, cg, kh * kw)
    y = np.zeros((batch, group, oh * ow, og), dtype=np.int64)
    for im in range(cg):
        xs = win[:, im::cg].reshape(batch, group, oh * ow, kh * kw).astype(np.float64)
        part = np.matmul(xs, wf[:, :, im].transpose(0, 2, 1))
        y = saturate(y + tdiv(part.astype(np.int64), 1 << n), bits)
    return [y.transpose(0, 1, 3, 2).reshape(batch, o, oh, ow)]


def issue18_conv_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """qcc.sim.fixed.conv_kernel as issue 18 left it (bias omitted): float64, one GEMM, a trunc,
    an add and a clip over the whole output per input channel."""
    win, w, n, bits = _geometry(node, args)
    group = node.attrs["group"]
    batch, _, oh, ow, kh, kw = win.shape
    o, cg = w.shape[:2]
    og = o // group
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    wt = np.ascontiguousarray(w.astype(np.float64).reshape(group, og, cg, kh * kw).transpose(2, 0, 3, 1))
    y = np.zeros((batch, group, oh * ow, og), dtype=np.float64)
    for im in range(cg):
        part = np.matmul(win[:, im::cg].astype(np.float64).reshape(batch, group, oh * ow, kh * kw), wt[im])
        np.trunc(np.multiply(part, 2.0 ** -n, out=part), out=part)
        np.add(y, part, out=y)
        np.clip(y, lo, hi, out=y)
    return [y.astype(np.int64).transpose(0, 1, 3, 2).reshape(batch, o, oh, ow)]


def layer(cin: int, cout: int, size: int, k: int, group: int, bits: int = 8) -> tuple[Node, list[np.ndarray]]:
    g = Graph("conv")
    x = g.add_input("x", TensorType("float32", (1, cin, size, size)))
    w = g.add_constant("w", np.zeros((cout, cin // group, k, k), np.float32))
    y = g.add("Conv", x, w, name="conv", group=group, pads=[k // 2] * 4)
    frac = 4 if bits == 8 else 8
    x.quant, w.quant, y.quant = FixedPoint(bits, frac, "trunc"), FixedPoint(bits, bits - 1), FixedPoint(bits, frac, "trunc")
    rng = np.random.default_rng(0)
    top = 1 << (bits - 1)
    return g.nodes[0], [rng.integers(0, top, (1, cin, size, size)), rng.integers(-top, top, w.const.shape)]


def load_baseline(path: str) -> Callable[[Node, list[np.ndarray]], list[np.ndarray]]:
    """conv_kernel of another checkout's qcc/sim/fixed.py (it imports this checkout's qcc)."""
    spec = importlib.util.spec_from_file_location("baseline_fixed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.conv_kernel  # type: ignore[no-any-return]


def best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", help="another checkout's qcc/sim/fixed.py, timed as an anchor")
    ap.add_argument("--bits", type=int, choices=(8, 16), default=8)
    args = ap.parse_args()
    baseline = load_baseline(args.baseline) if args.baseline else None
    old = args.bits == 8  # the issue-18 and pre-issue-18 copies are FIXED8 kernels
    print(f"2 CPUs shared; load average {os.getloadavg()[0]:.1f} at the start; FIXED{args.bits}")
    head = ["layer", "kernel (ms)", *(["baseline (ms)", "speed-up"] if baseline else []),
            *(["issue-18 kernel (ms)", "speed-up", "pre-issue-18 kernel (ms)", "speed-up"] if old else []),
            "float conv (ms)", "kernel / float"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    float_kernel = get_schema("Conv").kernel
    for name, cin, cout, size, k, group in LAYERS:
        node, ints = layer(cin, cout, size, k, group, args.bits)
        floats = [a.astype(np.float32) for a in ints]
        want = conv_kernel(node, ints)[0]
        anchors: dict[str, Callable[[Node, list[np.ndarray]], list[np.ndarray]]] = {}
        if baseline:
            anchors["baseline"] = baseline
        if old:
            anchors.update({"issue18": issue18_conv_kernel, "previous": previous_conv_kernel})
        for anchor in anchors.values():
            assert np.array_equal(anchor(node, ints)[0], want)
        now = ref = float("inf")
        times = dict.fromkeys(anchors, float("inf"))
        for _ in range(args.repeats):  # interleaved rounds: load changes hit all kernels alike
            now = min(now, best(lambda: conv_kernel(node, ints), 1))
            for key, anchor in anchors.items():
                times[key] = min(times[key], best(lambda: anchor(node, ints), 1))
            ref = min(ref, best(lambda: float_kernel(node, floats), 1))
        cells = [f"{now * 1e3:.1f}"] + [f"{t * 1e3:.1f} | {t / now:.2f}x" for t in times.values()]
        print(f"| {name} | " + " | ".join(cells) + f" | {ref * 1e3:.1f} | {now / ref:.1f}x |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
