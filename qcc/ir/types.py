"""Tensor types and quantization annotations: the IR's type system.

Quantization annotations are IR types (not side tables) so they are printed, parsed, verified
and carried through every pass like shapes are.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "uint16": np.dtype(np.uint16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}

Dim = int | str
"""A dimension: a non-negative int, or a symbol (e.g. the batch 'N')."""


def dtype_of(array: np.ndarray) -> str:
    for name, dt in DTYPES.items():
        if array.dtype == dt:
            return name
    raise ValueError(f"unsupported numpy dtype {array.dtype}")


@attrs.frozen
class TensorType:
    dtype: str
    shape: tuple[Dim, ...]

    def __attrs_post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self, symbols: dict[str, int] | None = None) -> int:
        """Element count, with symbolic dims bound by `symbols` (default 1: one sample)."""
        bound = symbols or {}
        return math.prod(d if isinstance(d, int) else bound.get(d, 1) for d in self.shape)

    def nbytes(self, symbols: dict[str, int] | None = None) -> int:
        return self.numel(symbols) * DTYPES[self.dtype].itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


# ---------------------------------------------------------------- quantization annotations


@attrs.frozen
class Float32:
    """Explicitly kept in float (a decision, unlike an unannotated value)."""

    def storage_bytes(self) -> float:
        return 4.0

    def __str__(self) -> str:
        return "float32"


FRAC_RANGE = (-32, 64)  # fixed-point fractions the verifier accepts (2**-frac stays a normal float32 step)


@attrs.frozen
class FixedPoint:
    """value = int * 2**-frac, signed `bits`-bit integer (nnabla FIXED8/FIXED16).

    `rounding` is how the value's producer stores what it computes: "half_even" (qcc's default,
    nnabla's converter for parameters) or "trunc" (toward zero, as nnabla-c-runtime stores every
    value it computes). It is part of the type so that it is printed, parsed and simulated like the
    rest; it does not take part in equality: two tensors of one format hold the same integers
    whatever rounded them.
    """

    bits: int
    frac: int
    rounding: str = attrs.field(default="half_even", eq=False)

    def __attrs_post_init__(self) -> None:
        if self.bits not in (4, 8, 16, 32):
            raise ValueError(f"fixed point bits must be 4, 8, 16 or 32, not {self.bits}")
        if self.rounding not in ("half_even", "trunc"):
            raise ValueError(f"fixed point rounding must be half_even or trunc, not {self.rounding!r}")

    @property
    def step(self) -> float:
        return float(2.0 ** -self.frac)

    def storage_bytes(self) -> float:
        return self.bits / 8

    def __str__(self) -> str:
        return f"fixed({self.bits},{self.frac})"

    def text(self) -> str:
        """The IR text form: the format, and the store rule when it is not the default."""
        tail = "" if self.rounding == "half_even" else f",{self.rounding}"
        return f"fixed({self.bits},{self.frac}{tail})"


AFFINE_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32}
"""Integer types an Affine annotation may store (4-bit: weights, two per byte)."""


def affine_bounds(dtype: str) -> tuple[int, int]:
    """The integers an affine dtype holds."""
    bits = AFFINE_BITS[dtype]
    return (0, (1 << bits) - 1) if dtype.startswith("u") else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


@attrs.frozen
class Affine:
    """q = clamp(round(x / scale) + zero_point); per tensor (axis None) or per channel."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    dtype: str
    axis: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.dtype not in AFFINE_BITS:
            raise ValueError(f"affine dtype must be an integer type, not {self.dtype!r}")
        if len(self.scale) != len(self.zero_point) or not self.scale:
            raise ValueError("affine scale and zero_point must be non-empty and of equal length")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("per-tensor affine needs exactly one scale")

    def storage_bytes(self) -> float:
        return AFFINE_BITS[self.dtype] / 8

    def __str__(self) -> str:
        scale = ",".join(map(repr, map(float, self.scale)))
        zp = ",".join(map(str, map(int, self.zero_point)))
        axis = "" if self.axis is None else f",axis={self.axis}"
        return f"affine({self.dtype},scale=[{scale}],zp=[{zp}]{axis})"


@attrs.frozen
class Sign:
    """Binary weights: +1 / -1, stored one bit per element (nnabla SIGN, parameters only)."""

    def storage_bytes(self) -> float:
        return 1 / 8

    def __str__(self) -> str:
        return "sign"


QuantType = Float32 | FixedPoint | Affine | Sign


def storage_bytes(ttype: TensorType, quant: QuantType | None) -> int:
    """Bytes a tensor occupies on a target once its quantization annotation is applied."""
    if quant is None:
        return ttype.nbytes()
    return math.ceil(ttype.numel() * quant.storage_bytes())


def quant_text(quant: QuantType) -> str:
    """An annotation as the IR text form writes it (`parse_quant` reads it back exactly)."""
    return quant.text() if isinstance(quant, FixedPoint) else str(quant)


def parse_quant(text: str) -> QuantType:
    """Inverse of str() on the annotation classes (used by the IR text parser)."""
    text = text.strip()
    if text == "float32":
        return Float32()
    if text == "sign":
        return Sign()
    if text.startswith("fixed(") and text.endswith(")"):
        parts = text[6:-1].split(",")
        rounding = parts.pop() if len(parts) == 3 else "half_even"
        bits, frac = (int(p) for p in parts)
        return FixedPoint(bits, frac, rounding)
    if text.startswith("affine(") and text.endswith(")"):
        body = text[7:-1]
        dtype, rest = body.split(",", 1)
        scale_txt = rest[rest.index("scale=[") + 7 : rest.index("]")]
        rest2 = rest[rest.index("zp=[") + 4 :]
        zp_txt = rest2[: rest2.index("]")]
        axis = None
        if "axis=" in rest2:
            axis = int(rest2[rest2.index("axis=") + 5 :])
        return Affine(
            tuple(float(s) for s in scale_txt.split(",")),
            tuple(int(z) for z in zp_txt.split(",")),
            dtype,
            axis,
        )
    raise ValueError(f"unknown quantization annotation {text!r}")
