"""torch.nn.LSTM (aten.lstm.input) unrolled into IR ops, so every stage can be quantized on its own.

Per layer, direction and time step t (names `<site>.l<layer>[_reverse].t<t>.<stage>`), the cell
of `qcc.frontends.recurrent`:
  ih = Dense(x_t, W_ih^T, b_ih + b_hh)      hh = Dense(h_{t-1}, W_hh^T)      gates = ih + hh
  i, f, g, o = Split(gates) -> Sigmoid, Sigmoid, Tanh, Sigmoid (PyTorch's gate order)
  c_t = f * c_{t-1} + i * g                  h_t = o * Tanh(c_t)
Zero initial states (PyTorch's default) drop the hh and f * c terms of the first step. The outputs
are the h_t stacked along time (the node named `<site>`), and h_n / c_n stacked per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.frontends.recurrent import Cell, lstm_step
from qcc.frontends.torch_aten import split
from qcc.frontends.torch_fx import TorchCtx, converts
from qcc.ir.core import Value


def _initial_states(ctx: TorchCtx, state: Any, count: int, part: str) -> list[Value | None]:
    """Per (layer, direction) (B, H) states; None where the state is a constant zero."""
    if ctx.is_const(state) and not np.any(ctx.array(state)):
        return [None] * count
    value = ctx.value(state, part)
    parts = split(ctx, value, 0, [1] * count, part=f"{part}split")
    return [ctx.emit("Squeeze", p, axes=[0], part=f"{part}{i}") for i, p in enumerate(parts)]


@converts("aten.lstm.input", emits=("Split", "Squeeze", "Dense", "Add", "Sigmoid", "Tanh", "Mul", "Unsqueeze", "Concat"),
          keep_whole=True)
def _lstm(ctx: TorchCtx, a: dict[str, Any]) -> tuple[Value, Value, Value]:
    x = ctx.value(a["input"])
    layers, directions = int(a["num_layers"]), 2 if a["bidirectional"] else 1
    params = list(a["params"])
    per = len(params) // (layers * directions)
    if per != (4 if a["has_biases"] else 2) or not all(ctx.is_const(p) for p in params):
        raise ctx.fail("LSTM with projections (proj_size) or non-constant weights is not supported")
    if a["train"] and float(a["dropout"]) > 0:
        raise ctx.fail("LSTM dropout in training mode (export the module in eval mode)")
    if x.type.rank != 3:
        raise ctx.fail(f"LSTM input of shape {x.type.shape}: expected a batched 3-D input")
    time_axis = 1 if a["batch_first"] else 0
    steps = int(ctx.static_shape(x)[time_axis])
    seq = [ctx.emit("Squeeze", p, axes=[time_axis], part=f"t{t}.x")
           for t, p in enumerate(split(ctx, x, time_axis, [1] * steps, part="x_split"))]
    h0 = _initial_states(ctx, a["hx"][0], layers * directions, "h0_")
    c0 = _initial_states(ctx, a["hx"][1], layers * directions, "c0_")
    h_n: list[Value] = []
    c_n: list[Value] = []
    for layer in range(layers):
        outputs = []
        for d in range(directions):
            index = layer * directions + d
            weights = [ctx.array(p) for p in params[index * per:(index + 1) * per]]
            names = [ctx.const_name(p) for p in params[index * per:(index + 1) * per]]
            tag = f"l{layer}{'_reverse' if d else ''}"
            hs, h, c = _direction(ctx, seq, weights, names, tag, h0[index], c0[index], reverse=bool(d))
            outputs.append(hs)
            h_n.append(h)
            c_n.append(c)
        seq = outputs[0] if directions == 1 else [
            ctx.emit("Concat", f, b, axis=1, part=f"l{layer}.t{t}.concat") for t, (f, b) in enumerate(zip(*outputs))]
    stacked = [ctx.emit("Unsqueeze", h, axes=[time_axis], part=f"t{t}.y") for t, h in enumerate(seq)]
    y = ctx.emit("Concat", *stacked, axis=time_axis, main=True) if len(stacked) > 1 else stacked[0]
    hn = ctx.emit("Concat", *[ctx.emit("Unsqueeze", h, axes=[0], part="h_n") for h in h_n], axis=0, part="h_n")
    cn = ctx.emit("Concat", *[ctx.emit("Unsqueeze", c, axes=[0], part="c_n") for c in c_n], axis=0, part="c_n")
    return y, hn, cn


def _direction(ctx: TorchCtx, seq: list[Value], weights: list[np.ndarray], names: list[str | None], tag: str,
               h: Value | None, c: Value | None, reverse: bool) -> tuple[list[Value], Value, Value]:
    w_ih, w_hh = weights[0], weights[1]
    bias = weights[2] + weights[3] if len(weights) == 4 else None
    hidden = int(w_hh.shape[1])
    w_ih_t = ctx.constant(np.ascontiguousarray(w_ih.T), f"{names[0] or tag + '.weight_ih'}_t")
    w_hh_t = ctx.constant(np.ascontiguousarray(w_hh.T), f"{names[1] or tag + '.weight_hh'}_t")
    b = ctx.constant(bias, (names[2] or f"{tag}.bias_ih").replace("bias_ih", "bias_ih_hh")) if bias is not None else None
    cell = Cell(w_ih_t, w_hh_t, b, hidden)
    hs: list[Value] = [seq[0]] * len(seq)
    for t in (reversed(range(len(seq))) if reverse else range(len(seq))):
        h, c = lstm_step(ctx, f"{tag}.t{t}", seq[t], h, c, cell)
        hs[t] = h
    assert h is not None and c is not None
    return hs, h, c
