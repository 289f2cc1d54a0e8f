"""ONNX LSTM and GRU unrolled into IR ops, one cell step per time step (`qcc.frontends.recurrent`,
the same cell as torch.nn.LSTM), so every stage can be quantized on its own.

Node names: `<node>.d<direction>.t<t>.<stage>`. Weights are reordered to PyTorch's gate order at
import (ONNX LSTM i, o, f, c -> i, f, g, o; GRU z, r, h -> r, z, n). Supported: the default
activations, forward/reverse/bidirectional, both layouts, constant weights, zero or given initial
states, GRU's linear_before_reset 0 and 1; not clip, input_forget, peepholes or sequence lengths
shorter than the input. Registered in `qcc.frontends.onnx.IMPORTERS` (which loads this module).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.frontends.onnx import _Ctx, importer
from qcc.frontends.onnx_layers import refuse, text
from qcc.frontends.recurrent import Cell, gru_step, lstm_step
from qcc.ir.core import Value

F32 = np.float32
EMITS = ("Split", "Squeeze", "Dense", "Add", "Sub", "Mul", "Sigmoid", "Tanh", "Unsqueeze", "Concat")
LSTM_ORDER = [0, 2, 3, 1]  # ONNX i, o, f, c -> i, f, c, o
GRU_ORDER = [1, 0, 2]  # ONNX z, r, h -> r, z, h
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


class _Steps:
    """The `recurrent.Builder` of one ONNX node: IR nodes named `<node>.<part>`."""

    def __init__(self, ctx: _Ctx, node: Any) -> None:
        self.ctx, self.node, self.graph = ctx, node, ctx.graph

    def emit(self, op: str, *inputs: Value | None, part: str | None = None, main: bool = False,
             **attributes: object) -> Value:
        return self.graph.add(op, *inputs, name=f"{self.node.name}.{part or op.lower()}", **attributes)

    def split(self, x: Value, axis: int, sizes: list[int], part: str) -> list[Value]:
        if len(sizes) == 1:
            return [x]
        return list(self.graph.add_node("Split", [x], {"axis": axis, "split": sizes},
                                        name=f"{self.node.name}.{part}").outputs)

    def constant(self, data: np.ndarray, part: str) -> Value:
        return self.graph.add_constant(self.graph.unique_name(f"{self.node.name}.{part}"),
                                       np.ascontiguousarray(data, dtype=F32))


def _reordered(blocks: np.ndarray, gates: int, order: list[int]) -> np.ndarray:
    """(gates * H, ...) rows regrouped in `order`."""
    parts = blocks.reshape(gates, -1, *blocks.shape[1:])
    return parts[order].reshape(blocks.shape)


def _optional(ctx: _Ctx, node: Any, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


def _check(ctx: _Ctx, node: Any, attrs: dict[str, Any], steps: int) -> None:
    activations = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    per = DEFAULT_ACTIVATIONS[node.op_type]
    if activations and activations != per * (len(activations) // len(per)):
        raise refuse(ctx, node, f"activations {activations} (only the default {per})")
    if "clip" in attrs or attrs.get("input_forget", 0):
        raise refuse(ctx, node, "clip and input_forget are not supported")
    for index in (1, 2):
        if not ctx.is_const(node.input[index]):
            raise refuse(ctx, node, "weights computed at run time")
    lens = _optional(ctx, node, 4)
    if lens is not None and not np.all(ctx.const(lens, node) == steps):
        raise refuse(ctx, node, "sequence_lens shorter than the sequence")
    peep = _optional(ctx, node, 7) if node.op_type == "LSTM" else None
    if peep is not None and np.any(ctx.const(peep, node)):
        raise refuse(ctx, node, "peepholes")


def _initial(ctx: _Ctx, node: Any, b: _Steps, index: int, dirs: int, layout: int, part: str) -> list[Value | None]:
    """Per direction a (batch, hidden) state, None for a zero state."""
    name = _optional(ctx, node, index)
    if name is None or (ctx.is_const(name) and not np.any(ctx.const(name, node))):
        return [None] * dirs
    state = ctx.value(name)
    assert state is not None
    axis = 1 if layout else 0
    return [b.emit("Squeeze", p, part=f"{part}{d}", axes=[axis]) for d, p in enumerate(b.split(state, axis, [1] * dirs,
                                                                                                f"{part}split"))]


def _import_rnn(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    layout = int(attrs.get("layout", 0))
    time_axis = 1 if layout else 0
    steps = x.type.shape[time_axis]
    if x.type.rank != 3 or not isinstance(steps, int):
        raise refuse(ctx, node, f"input of shape {x.type.shape}: needs (seq, batch, input) with a static length")
    _check(ctx, node, attrs, steps)
    direction = text(attrs, "direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = int(attrs["hidden_size"])
    lstm = node.op_type == "LSTM"
    gates = 4 if lstm else 3
    b = _Steps(ctx, node)
    seq = [b.emit("Squeeze", p, part=f"t{t}.x", axes=[time_axis])
           for t, p in enumerate(b.split(x, time_axis, [1] * steps, "x_split"))]
    w_all, r_all = ctx.const(node.input[1], node), ctx.const(node.input[2], node)
    bias_name = _optional(ctx, node, 3)
    b_all = ctx.const(bias_name, node) if bias_name else np.zeros((dirs, 2 * gates * hidden), F32)
    h0 = _initial(ctx, node, b, 5, dirs, layout, "h0_")
    c0 = _initial(ctx, node, b, 6, dirs, layout, "c0_") if lstm else [None] * dirs
    outputs: list[list[Value]] = []
    last_h: list[Value] = []
    last_c: list[Value] = []
    for d in range(dirs):
        cell = _cell(b, d, w_all[d], r_all[d], b_all[d], hidden, lstm, bool(attrs.get("linear_before_reset", 0)))
        reverse = d == 1 or direction == "reverse"
        h, c = h0[d], c0[d]
        hs: list[Value] = [seq[0]] * steps
        for t in (reversed(range(steps)) if reverse else range(steps)):
            at = f"d{d}.t{t}"
            if lstm:
                h, c = lstm_step(b, at, seq[t], h, c, cell)
            else:
                h = gru_step(b, at, seq[t], h, cell)
            hs[t] = h
        assert h is not None
        outputs.append(hs)
        last_h.append(h)
        if c is not None:
            last_c.append(c)
    _bind_outputs(ctx, node, b, outputs, last_h, last_c, layout)


def _cell(b: _Steps, d: int, w: np.ndarray, r: np.ndarray, bias: np.ndarray, hidden: int, lstm: bool,
          linear_before_reset: bool) -> Cell:
    gates = 4 if lstm else 3
    order = LSTM_ORDER if lstm else GRU_ORDER
    w, r = _reordered(w, gates, order), _reordered(r, gates, order)
    wb, rb = _reordered(bias[:gates * hidden], gates, order), _reordered(bias[gates * hidden:], gates, order)
    w_ih = b.constant(w.T, f"d{d}.w_t")
    if lstm:
        return Cell(w_ih, b.constant(r.T, f"d{d}.r_t"), b.constant(wb + rb, f"d{d}.bias"), hidden)
    if not linear_before_reset:  # every hidden bias adds outside the reset gate: all in the input's bias
        h2 = 2 * hidden
        return Cell(w_ih, b.constant(r[:h2].T, f"d{d}.r_rz_t"), b.constant(wb + rb, f"d{d}.bias"), hidden,
                    w_hn=b.constant(r[h2:].T, f"d{d}.r_n_t"))
    w_hh = b.constant(r.T, f"d{d}.r_t")
    folded = wb.copy()
    folded[:2 * hidden] += rb[:2 * hidden]
    n_only = np.concatenate([np.zeros(2 * hidden, F32), rb[2 * hidden:]])
    return Cell(w_ih, w_hh, b.constant(folded, f"d{d}.bias"), hidden, b.constant(n_only, f"d{d}.bias_hh"),
                b.constant(rb[2 * hidden:], f"d{d}.bias_hn"))


def _bind_outputs(ctx: _Ctx, node: Any, b: _Steps, outputs: list[list[Value]], last_h: list[Value],
                  last_c: list[Value], layout: int) -> None:
    """Y (seq, dirs, batch, hidden) [layout 1: (batch, seq, dirs, hidden)], Y_h and Y_c (dirs, batch,
    hidden) [layout 1: (batch, dirs, hidden)]; only the outputs the graph reads are built."""
    dir_axis = 1 if layout else 0

    def stack(values: list[Value], axis: int, part: str) -> Value:
        parts = [b.emit("Unsqueeze", v, part=f"{part}_unsqueeze", axes=[axis]) for v in values]
        return parts[0] if len(parts) == 1 else b.emit("Concat", *parts, part=part, axis=axis)

    names = [*node.output, "", "", ""]
    if names[0]:
        per_step = [stack([hs[t] for hs in outputs], dir_axis, f"t{t}.y") for t in range(len(outputs[0]))]
        ctx.bind(names[0], stack(per_step, 1 if layout else 0, "y"))
    for name, finals, part in ((names[1], last_h, "y_h"), (names[2], last_c, "y_c")):
        if name:
            ctx.bind(name, stack(finals, dir_axis, part))


importer("LSTM", emits=EMITS)(_import_rnn)
importer("GRU", emits=EMITS)(_import_rnn)
