"""Element types of the generated C: float32, and signed 8/16-bit fixed point."""

from __future__ import annotations

import attrs

from qcc.ir.types import FixedPoint
from qcc.quant.numerics import fixed_bounds


@attrs.frozen
class CType:
    """How a tensor is stored in C; `fixed` is None for float32."""

    fixed: FixedPoint | None = None

    @property
    def is_int(self) -> bool:
        return self.fixed is not None

    @property
    def bits(self) -> int:
        return self.fixed.bits if self.fixed is not None else 32

    @property
    def name(self) -> str:
        return "float" if self.fixed is None else f"int{self.fixed.bits}_t"

    @property
    def suffix(self) -> str:
        return "f32" if self.fixed is None else f"i{self.fixed.bits}"

    @property
    def size(self) -> int:
        return self.bits // 8

    @property
    def lo(self) -> int:
        return fixed_bounds(self.bits)[0]

    @property
    def hi(self) -> int:
        return fixed_bounds(self.bits)[1]

    def get(self, expr: str, inv: str) -> str:
        """C float expression reading an element (the runtime's getter)."""
        return expr if self.fixed is None else f"((float){expr} * {inv})"

    def set(self, expr: str, scale: str) -> str:
        """C expression storing a float (the runtime's setter: truncation, saturation)."""
        if self.fixed is None:
            return expr
        return f"({self.name})qcc_store({expr}, {scale}, {self.lo}, {self.hi})"


FLOAT = CType()


def pow2(exp: int) -> str:
    """2**exp as an exact C99 hexadecimal float literal."""
    return f"0x1p{exp}f"


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
