"""The lowered network: nnabla variables and functions before buffers and slots are assigned.

Lowering (`lower.py`) turns IR values and nodes into `NVar`s and `NFunc`s; the rule checks
(`legalize.py`) and the buffer planner (`plan.py`) work on this form; `assemble.py` turns it
into an `NnbFile`. Every variable keeps the IR value it stores, so a rule violation can name the
tensor and, when qcc chose the type, change the value's annotation instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np

from qcc.errors import UnsupportedError
from qcc.ir.core import Node, Value
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign

from .format import ArgValue, DataType, activation_size, encode_values

MAX_FP_POS = 15  # the 4-bit field of the variable struct
BITS = {DataType.INT16: 16, DataType.INT8: 8}


@attrs.frozen
class Storage:
    """How a tensor is stored in the file: element type and fixed-point position."""

    dtype: DataType
    fp_pos: int = 0

    @property
    def is_fixed(self) -> bool:
        return self.dtype in BITS

    @property
    def quant(self) -> QuantType:
        """The IR annotation with the same meaning."""
        if self.dtype == DataType.SIGN:
            return Sign()
        if self.is_fixed:
            return FixedPoint(BITS[self.dtype], self.fp_pos)
        return Float32()

    def __str__(self) -> str:
        if self.is_fixed:
            return f"FIXED{BITS[self.dtype]}_{self.fp_pos}"
        return "SIGN" if self.dtype == DataType.SIGN else "FLOAT32"


FLOAT = Storage(DataType.FLOAT)


def storage_of(value: Value, what: str = "") -> Storage:
    """The .nnb storage of a value's annotation; UnsupportedError for what .nnb cannot hold."""
    quant = value.quant
    where = what or f"tensor {value.name!r}"
    if quant is None or isinstance(quant, Float32):
        return FLOAT
    if isinstance(quant, Sign):
        if not value.is_const:
            raise UnsupportedError(f"{where}: SIGN is for parameters only; .nnb cannot store an activation as signs")
        return Storage(DataType.SIGN)
    if isinstance(quant, Affine):
        quant = _affine_as_fixed(quant, where)
    if isinstance(quant, FixedPoint):
        if quant.bits == 4 and value.is_const:  # fixed4 weights: -8..7 are FIXED8 values at the same position
            quant = FixedPoint(8, quant.frac)
        if quant.bits not in (8, 16):
            raise UnsupportedError(f"{where}: .nnb has FIXED8 and FIXED16, not {quant.bits}-bit fixed point")
        if not 0 <= quant.frac <= MAX_FP_POS:
            raise UnsupportedError(
                f"{where}: fixed-point position {quant.frac} is outside the 0..{MAX_FP_POS} .nnb can store"
            )
        return Storage(DataType.INT16 if quant.bits == 16 else DataType.INT8, quant.frac)
    raise UnsupportedError(f"{where}: annotation {quant} has no .nnb type")


def _affine_as_fixed(quant: Affine, where: str) -> FixedPoint:
    """A per-tensor, zero-point-0, power-of-two affine int8/int16 is fixed point; nothing else is."""
    if quant.axis is None and quant.zero_point == (0,) and quant.dtype in ("int8", "int16"):
        mantissa, exponent = math.frexp(quant.scale[0])
        if mantissa == 0.5:
            return FixedPoint(8 if quant.dtype == "int8" else 16, 1 - exponent)
    raise UnsupportedError(
        f"{where}: .nnb stores fixed point (scale 2**-n, zero point 0), not {quant}; "
        "use --quantize fixed8/fixed16 for the nnb target"
    )


def stored_values(array: np.ndarray, quant: QuantType | None, storage: Storage) -> np.ndarray:
    """The numbers a parameter annotated `quant` is stored as in `storage`, exactly as qcc's
    simulator uses them (qcc.sim.fixed): round half to even into the annotation, then, for
    another position, truncate toward zero (or scale up) and saturate."""
    from qcc.sim.fixed import quantize_round, requantize, to_float

    array = np.asarray(array, dtype=np.float32)
    if storage.dtype == DataType.SIGN:
        return np.where(array >= 0, 1, -1)
    src = quant if isinstance(quant, FixedPoint) else None
    if isinstance(quant, Sign):
        array = np.where(array >= 0, 1.0, -1.0).astype(np.float32)
    if storage.dtype == DataType.FLOAT:
        return to_float(quantize_round(array, src), src.frac) if src is not None else array
    target = FixedPoint(BITS[storage.dtype], storage.fp_pos)
    if src is None:
        return quantize_round(array, target)
    return requantize(quantize_round(array, src), src.frac, target.frac, target.bits)


def encode_param(array: np.ndarray, quant: QuantType | None, storage: Storage) -> bytes:
    """Parameter bytes for `stored_values`."""
    return encode_values(stored_values(array, quant, storage), storage.dtype)


@attrs.define(eq=False, repr=False)
class NVar:
    """One nnabla variable: an activation (`data` None) or a parameter."""

    name: str
    shape: tuple[int, ...]
    storage: Storage
    source: Value | None = None  # the IR value it stores (None: a conversion qcc added)
    data: bytes | None = None
    array: np.ndarray | None = None  # the parameter's values as the file lays them out (float)

    @property
    def is_param(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, version: int) -> int:
        """What its buffer must hold: elements in version 2, bytes in version 3."""
        if version == 2:
            return self.size if self.storage.dtype != DataType.SIGN else (self.size + 31) // 32
        return activation_size(self.storage.dtype, self.size)

    @property
    def pinned(self) -> bool:
        return bool(self.source is not None and self.source.meta.get("pinned"))

    def __repr__(self) -> str:
        return f"<NVar {self.name} {self.shape} {self.storage}>"


@attrs.define(eq=False, repr=False)
class NFunc:
    """One nnabla function call; `args` by nnabla argument name (see FunctionTable.spec)."""

    name: str
    kind: str
    inputs: list[NVar]
    outputs: list[NVar]
    args: dict[str, ArgValue] = attrs.field(factory=dict)
    node: Node | None = None
    impl: int = 0

    def __repr__(self) -> str:
        return f"<NFunc {self.name} = {self.kind}>"


@attrs.define(eq=False)
class Program:
    """Variables in file order, functions in execution order, graph inputs and outputs."""

    variables: list[NVar] = attrs.field(factory=list)
    functions: list[NFunc] = attrs.field(factory=list)
    inputs: list[NVar] = attrs.field(factory=list)
    outputs: list[NVar] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)
    meta: dict[str, Any] = attrs.field(factory=dict)

    def activations(self) -> Iterator[NVar]:
        return (v for v in self.variables if not v.is_param)

    def index(self) -> dict[int, int]:
        """id(NVar) -> position in the file."""
        return {id(v): i for i, v in enumerate(self.variables)}
