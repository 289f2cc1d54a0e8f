"""Shape arithmetic and window helpers shared by the op schemas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from qcc.ir.types import Dim, TensorType


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out: list[Dim] = []
    for dims in zip(*padded):
        chosen: Dim = 1
        for d in dims:
            if d == 1:
                continue
            if chosen == 1:
                chosen = d
            elif d != chosen:
                raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(chosen)
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def spatial_out(size: Dim, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int = 1,
                ceil_mode: bool = False) -> Dim:
    if not isinstance(size, int):
        raise ValueError(f"spatial dimension {size!r} must be static")
    span = dilation * (kernel - 1) + 1
    total = size + pad_begin + pad_end - span
    if total < 0:
        raise ValueError(f"window {span} larger than padded input {size + pad_begin + pad_end}")
    if ceil_mode:
        out = -(-total // stride) + 1
        if (out - 1) * stride >= size + pad_begin:
            out -= 1
        return out
    return total // stride + 1


def pairs(values: Sequence[int], n: int, name: str) -> list[int]:
    if len(values) != n:
        raise ValueError(f"{name} must have {n} values, got {list(values)}")
    return list(values)


def same(types: list[TensorType]) -> list[TensorType]:
    return [types[0]]


def attr_list(attrs: dict[str, Any], key: str, n: int, fill: int) -> list[int]:
    value = attrs.get(key) or []
    return list(value) if value else [fill] * n


def windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """(N, C, OH, OW, KH, KW) strided view of an already padded NCHW array."""
    kh, kw = kernel
    dh, dw = dilations
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    view = np.lib.stride_tricks.sliding_window_view(x, (span_h, span_w), axis=(2, 3))  # type: ignore[call-overload]
    view = view[:, :, :: strides[0], :: strides[1], ::dh, ::dw]
    return view


def prod(values: Sequence[int]) -> int:
    return int(math.prod(values))
