"""Element types of the generated C: float32, signed 8/16-bit fixed point (fixed4's 4-bit weights
in int8_t: C has no smaller type; `modes.fixed` packs them two a byte), affine int8/uint8."""

from __future__ import annotations

import attrs
import numpy as np

from qcc.ir.types import Affine, FixedPoint
from qcc.quant.numerics import AFFINE_DTYPES, fixed_bounds, fixed_container_bits


@attrs.frozen
class CType:
    """How a tensor is stored in C; float32 when neither `fixed` nor `affine` is set, int32
    element indices with `index` (ArgMax, TopK: the same in every numeric mode)."""

    fixed: FixedPoint | None = None
    affine: Affine | None = None
    index: bool = False

    @property
    def is_int(self) -> bool:
        return self.fixed is not None or self.affine is not None or self.index

    @property
    def bits(self) -> int:
        if self.affine is not None:
            return 8 * int(self.affine.storage_bytes())
        return fixed_container_bits(self.fixed.bits) if self.fixed is not None else 32

    @property
    def name(self) -> str:
        if self.index:
            return "int32_t"
        if self.affine is not None:
            return f"{self.affine.dtype}_t"
        return "float" if self.fixed is None else f"int{self.bits}_t"

    @property
    def suffix(self) -> str:
        if self.index:
            return "idx"
        if self.affine is not None:
            return "q" + self.affine.dtype.replace("int", "")
        return "f32" if self.fixed is None else f"i{self.bits}"

    @property
    def size(self) -> int:
        return self.bits // 8

    @property
    def lo(self) -> int:
        return AFFINE_DTYPES[self.affine.dtype][0] if self.affine is not None else fixed_bounds(self.bits)[0]

    @property
    def hi(self) -> int:
        return AFFINE_DTYPES[self.affine.dtype][1] if self.affine is not None else fixed_bounds(self.bits)[1]

    def get(self, expr: str, inv: str) -> str:
        """C float expression reading an element: fixed point `q * inv` (the runtime's getter),
        affine `(q - zx) * sx` (kernel parameters sx, zx: `scale_params`)."""
        if self.affine is not None:
            return f"((float)((int32_t){expr} - zx) * sx)"
        return expr if self.fixed is None else f"((float){expr} * {inv})"

    def set(self, expr: str, scale: str) -> str:
        """C expression storing a float: fixed point `v * scale` truncated and saturated (the
        runtime's setter), affine `v / sy + zy` rounded half to even and saturated."""
        if self.affine is not None:
            return f"({self.name})qcc_quantize({expr}, sy, zy, {self.lo}, {self.hi})"
        if self.fixed is None:
            return expr
        return f"({self.name})qcc_store({expr}, {scale}, {self.lo}, {self.hi})"

    @property
    def setter(self) -> tuple[str, ...]:
        """The helper `set` calls."""
        return ("quantize",) if self.affine is not None else ("store",) if self.fixed is not None else ()


def scale_params(x: CType, y: CType) -> list[str]:
    """The kernel parameters `get` (of x) and `set` (of y) read."""
    xs = ["float sx", "int32_t zx"] if x.affine is not None else ["float xinv"] if x.is_int else []
    ys = ["float sy", "int32_t zy"] if y.affine is not None else ["float yscale"] if y.is_int else []
    return xs + ys


FLOAT = CType()
INDEX = CType(index=True)


def pow2(exp: int) -> str:
    """2**exp as an exact C99 hexadecimal float literal."""
    return f"0x1p{exp}f"


def hexfloat(value: float) -> str:
    """A value rounded to float32, as an exact C99 hexadecimal float literal."""
    return f"{float(np.float32(value)).hex()}f"


def comment_text(text: str) -> str:
    """Text safe inside a C comment: no comment end, no trigraph, one line."""
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text.replace("*/", "* /").replace("??", "? ?")


def string_literal(text: str) -> str:
    """A C string literal for any text (escapes, no trigraphs)."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        if ch in '\\"?':
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'
