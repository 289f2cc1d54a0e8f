"""One time step of an LSTM or GRU cell as IR ops, shared by the frontends that unroll them
(torch.nn.LSTM, ONNX LSTM/GRU), so every stage can be quantized on its own.

Weights arrive in PyTorch's layout and gate order (LSTM i, f, g, o; GRU r, z, n), already as
Dense weights (input, gates * hidden); frontends reorder other layouts at import. Stage names:
`<at>.ih`, `.hh`, `.gates`, `.split`, one per gate (`.i`, `.f`, `.g`, `.o`; `.r`, `.z`, `.n`), and
the products and sums named in each function. A missing state (None) is a zero state: its terms
are left out.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from qcc.ir.core import Value


class Builder(Protocol):
    """What a frontend's import context offers: IR nodes named `<site>.<part>`."""

    def emit(self, op: str, *inputs: Value | None, part: str | None = None, main: bool = False,
             **attributes: object) -> Value: ...

    def split(self, x: Value, axis: int, sizes: list[int], part: str) -> list[Value]: ...


@attrs.frozen
class Cell:
    """One direction's weights: x (N, I) @ w_ih + h (N, H) @ w_hh, gates stacked along columns."""

    w_ih: Value
    w_hh: Value
    bias: Value | None
    """b_ih + b_hh (GRU: of r and z; the n gate's part is b_ih of n alone)."""
    hidden: int
    bias_hh: Value | None = None
    """GRU: (0, 0, b_hh of n), the bias of h @ w_hh (the reset gate multiplies it)."""
    bias_hn: Value | None = None
    """GRU: b_hh of n alone, what h @ w_hh + bias_hh is for a zero state."""
    w_hn: Value | None = None
    """GRU with the reset gate applied before the product (ONNX linear_before_reset=0): the n
    gate's (H, H) weight, applied to r * h; w_hh then holds the r and z gates only and every
    hidden bias is in `bias`."""


def _projections(b: Builder, at: str, x: Value, h: Value | None, cell: Cell) -> tuple[Value, Value | None]:
    ih = b.emit("Dense", x, cell.w_ih, cell.bias, part=f"{at}.ih")
    hh = b.emit("Dense", h, cell.w_hh, cell.bias_hh, part=f"{at}.hh") if h is not None else None
    return ih, hh


def lstm_step(b: Builder, at: str, x: Value, h: Value | None, c: Value | None, cell: Cell) -> tuple[Value, Value]:
    """c = f * c + i * g, h = o * tanh(c) (PyTorch's gate order i, f, g, o)."""
    gates, recur = _projections(b, at, x, h, cell)
    if recur is not None:
        gates = b.emit("Add", gates, recur, part=f"{at}.gates")
    i, f, g, o = b.split(gates, 1, [cell.hidden] * 4, f"{at}.split")
    i = b.emit("Sigmoid", i, part=f"{at}.i")
    g = b.emit("Tanh", g, part=f"{at}.g")
    o = b.emit("Sigmoid", o, part=f"{at}.o")
    ig = b.emit("Mul", i, g, part=f"{at}.ig")
    if c is None:
        c = ig
    else:
        f = b.emit("Sigmoid", f, part=f"{at}.f")
        c = b.emit("Add", b.emit("Mul", f, c, part=f"{at}.fc"), ig, part=f"{at}.c")
    h = b.emit("Mul", o, b.emit("Tanh", c, part=f"{at}.tanh_c"), part=f"{at}.h")
    return h, c


def gru_step(b: Builder, at: str, x: Value, h: Value | None, cell: Cell) -> Value:
    """n = tanh(xn + r * hn), h = n + z * (h - n) (PyTorch's GRU: r, z, n; ONNX linear_before_reset=1);
    with `cell.w_hn`, n = tanh(xn + (r * h) @ w_hn) (linear_before_reset=0)."""
    ih, hh = _projections(b, at, x, h, cell)
    size = [cell.hidden] * 3
    xr, xz, xn = b.split(ih, 1, size, f"{at}.split_x")
    if cell.w_hn is not None and h is not None and hh is not None:
        hr, hz = b.split(hh, 1, size[:2], f"{at}.split_h")
        r = b.emit("Sigmoid", b.emit("Add", xr, hr, part=f"{at}.r_in"), part=f"{at}.r")
        z = b.emit("Sigmoid", b.emit("Add", xz, hz, part=f"{at}.z_in"), part=f"{at}.z")
        hn = b.emit("Dense", b.emit("Mul", r, h, part=f"{at}.rh"), cell.w_hn, part=f"{at}.hn")
        n = b.emit("Tanh", b.emit("Add", xn, hn, part=f"{at}.n_in"), part=f"{at}.n")
        keep = b.emit("Mul", z, b.emit("Sub", h, n, part=f"{at}.h_minus_n"), part=f"{at}.z_keep")
        return b.emit("Add", n, keep, part=f"{at}.h")
    if hh is None:  # zero state: h @ w_hh is the n gate's bias only
        r = b.emit("Sigmoid", xr, part=f"{at}.r")
        z = b.emit("Sigmoid", xz, part=f"{at}.z")
        pre = xn if cell.bias_hn is None else b.emit("Add", xn, b.emit("Mul", r, cell.bias_hn, part=f"{at}.rh"),
                                                    part=f"{at}.n_in")
        n = b.emit("Tanh", pre, part=f"{at}.n")
        return b.emit("Sub", n, b.emit("Mul", z, n, part=f"{at}.zn"), part=f"{at}.h")
    hr, hz, hn = b.split(hh, 1, size, f"{at}.split_h")
    r = b.emit("Sigmoid", b.emit("Add", xr, hr, part=f"{at}.r_in"), part=f"{at}.r")
    z = b.emit("Sigmoid", b.emit("Add", xz, hz, part=f"{at}.z_in"), part=f"{at}.z")
    n = b.emit("Tanh", b.emit("Add", xn, b.emit("Mul", r, hn, part=f"{at}.rh"), part=f"{at}.n_in"), part=f"{at}.n")
    keep = b.emit("Mul", z, b.emit("Sub", h, n, part=f"{at}.h_minus_n"), part=f"{at}.z_keep")
    return b.emit("Add", n, keep, part=f"{at}.h")
