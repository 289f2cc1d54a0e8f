"""The .nnb file format of nnabla-c-runtime, as plain data: read, check and write it.

Layout (little-endian, every block padded to 4 bytes)::

    header: 14 x uint32  version, api_level, then {size, slot} for buffers, variables,
                         functions, inputs, outputs, then num_of_data, data_size
    index:  uint32[num_of_data]   byte offset of each block ("slot") in the data area
    data:   data_size bytes       the blocks

A list is {uint32 size; int32 slot}. Variables are 20-byte structs (id, shape list,
fp_pos << 4 | type, int32 data_index: < 0 is activation buffer -data_index-1, >= 0 the slot of
the parameter data). Functions are {uint16 type, uint16 impl, inputs list, outputs list} followed
by their arguments laid out by the function's argument format (see `functions.py`).

The runtime has no magic number or checksum and trusts every offset, so `read_nnb` checks all
of them before use and turns any inconsistency into `InvalidInputError`. `write_nnb` lays the
blocks out in exactly the order nnabla's converter does, so a file nnabla wrote comes back
byte for byte. Affine weights are stored transposed to (out, in) by whoever builds the file;
this module does not interpret tensor contents.
"""

from __future__ import annotations

import enum
import itertools
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import attrs
import numpy as np

from qcc.errors import InternalError, InvalidInputError, UnsupportedError

from .functions import FunctionTable, default_table, tokenize_argfmt

VERSIONS = (2, 3)  # 2: buffer sizes in elements (4 bytes each); 3: buffer sizes in bytes
HEADER = struct.Struct("<14I")
VARIABLE = struct.Struct("<III4si")  # id, shape size, shape slot, (type|fp<<4, 3 pad), data_index
FUNCTION_HEAD = struct.Struct("<HHIIII")  # type, impl, inputs {size, slot}, outputs {size, slot}
ARG_WIDTH = {"iI": 8, "i": 4, "f": 4, "B": 1}  # bytes per argument token ("fF"/"C": none)

ArgValue = int | float | tuple[int, ...]


class DataType(enum.IntEnum):
    """Element type codes of nn_data_type_t."""

    FLOAT = 0
    INT16 = 1
    INT8 = 2
    SIGN = 3


def payload_size(dtype: DataType, count: int) -> int:
    """Bytes of a parameter of `count` elements (SIGN: one bit each, LSB first)."""
    if dtype == DataType.SIGN:
        return (count + 7) // 8
    return count * {DataType.FLOAT: 4, DataType.INT16: 2, DataType.INT8: 1}[dtype]


def activation_size(dtype: DataType, count: int) -> int:
    """Bytes the runtime touches in an activation buffer (SIGN is read as uint32 words)."""
    if dtype == DataType.SIGN:
        return 4 * ((count + 31) // 32)
    return payload_size(dtype, count)


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _amount(n: int) -> str:
    """A size for a message: corrupt shapes multiply to integers too long to print."""
    return str(n) if n < 10**18 else "more than 10**18"


@attrs.frozen
class Variable:
    """A tensor: an activation living in `buffer`, or a parameter whose bytes are `data`.

    The file's data_index is derived on write: -(buffer + 1), or the slot of `data`.
    """

    shape: tuple[int, ...]
    dtype: DataType
    fp_pos: int = 0  # value = stored integer * 2**-fp_pos for INT16/INT8
    buffer: int | None = None
    data: bytes | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@attrs.frozen
class Function:
    """One node: function id, implementation, variable indices and encoded arguments.

    `args` holds one value per token of the function's argument format at the file's API
    level: int for "i" (int64/string index), float for "f", int 0..255 for "B" (bool),
    tuple of ints for "iI" (Shape/repeated int64).
    """

    type_id: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    args: tuple[ArgValue, ...] = ()
    impl: int = 0


@attrs.frozen
class NnbFile:
    """A whole .nnb file; variables and functions are referred to by position."""

    version: int
    api_level: int
    buffers: tuple[int, ...]  # sizes: elements (version 2) or bytes (version 3)
    variables: tuple[Variable, ...]
    functions: tuple[Function, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


_NUMPY_TYPES: dict[DataType, np.dtype[Any]] = {
    DataType.FLOAT: np.dtype("<f4"),
    DataType.INT16: np.dtype("<i2"),
    DataType.INT8: np.dtype("i1"),
}


def encode_values(values: np.ndarray, dtype: DataType) -> bytes:
    """Parameter bytes for already-quantized values (integers for INT16/INT8, signs for SIGN)."""
    flat = np.asarray(values).reshape(-1)
    if dtype == DataType.SIGN:
        return np.packbits(flat > 0, bitorder="little").tobytes()
    np_type = _NUMPY_TYPES[dtype]
    if dtype != DataType.FLOAT:
        info = np.iinfo(np_type)
        bad = flat.size and (flat.min() < info.min or flat.max() > info.max)
        if bad or np.any(flat != np.round(flat)):
            raise InternalError(
                f"{dtype.name} parameter values must be integers in {info.min}..{info.max}"
            )
    return flat.astype(np_type).tobytes()


def decode_values(data: bytes, dtype: DataType, count: int) -> np.ndarray:
    """The stored numbers of a parameter: float32, int16, int8, or +1/-1 float32 for SIGN."""
    if dtype == DataType.SIGN:
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")[:count]
        return np.where(bits == 1, 1.0, -1.0).astype(np.float32)
    return np.frombuffer(data, _NUMPY_TYPES[dtype], count).copy()


# ----------------------------------------------------------------------------- checking


def check_nnb(nnb: NnbFile, table: FunctionTable | None = None) -> list[str]:
    """Every inconsistency the runtime would trip over (or that nnabla never writes)."""
    table = table or default_table()
    problems: list[str] = []
    add = problems.append
    if nnb.version not in VERSIONS:
        add(f"version {nnb.version} is not one of {VERSIONS}")
    if not 1 <= nnb.api_level <= table.max_level:
        add(f"API level {nnb.api_level} is outside 1..{table.max_level} ({table.source})")
    if any(not _fits(b, 32, False) for b in nnb.buffers):
        add("buffer sizes must be uint32")
    nvar = len(nnb.variables)
    for what, ids in (("input", nnb.inputs), ("output", nnb.outputs)):
        bad = [i for i in ids if not 0 <= i < nvar]
        if bad:
            add(f"{what} variable indices {bad} out of range (have {nvar} variables)")
    for n, var in enumerate(nnb.variables):
        problems.extend(f"variable {n}: {p}" for p in _variable_problems(var, len(nnb.buffers)))
    for n, fn in enumerate(nnb.functions):
        problems.extend(f"function {n}: {p}" for p in _function_problems(fn, nnb, table))
    problems.extend(_buffer_size_problems(nnb))
    return problems


def _fits(value: object, bits: int, signed: bool) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return lo <= value <= hi


def _variable_problems(var: Variable, nbuf: int) -> Iterable[str]:
    if not all(_fits(d, 32, False) for d in var.shape):
        yield f"shape {var.shape} must hold uint32 dimensions"
        return
    if var.dtype not in tuple(DataType):
        yield f"type code {var.dtype} is not 0..3"
        return
    if not _fits(var.fp_pos, 4, False):
        yield f"fp_pos {var.fp_pos} does not fit the 4-bit field (0..15)"
    if (var.buffer is None) == (var.data is None):
        yield "needs exactly one of an activation buffer or parameter data"
    elif var.buffer is not None and not 0 <= var.buffer < nbuf:
        yield f"buffer {var.buffer} out of range (have {nbuf} buffers)"
    elif var.data is not None and len(var.data) != payload_size(var.dtype, var.size):
        want = payload_size(var.dtype, var.size)
        yield f"parameter data is {len(var.data)} bytes; shape {var.shape} needs {_amount(want)}"


def _function_problems(fn: Function, nnb: NnbFile, table: FunctionTable) -> Iterable[str]:
    nvar = len(nnb.variables)
    if not _fits(fn.impl, 16, False):
        yield f"impl {fn.impl} is not uint16"
    for what, ids in (("input", fn.inputs), ("output", fn.outputs)):
        bad = [i for i in ids if not 0 <= i < nvar]
        if bad:
            yield f"{what} variable indices {bad} out of range (have {nvar} variables)"
    spec = table.by_id(fn.type_id, nnb.api_level) if _fits(fn.type_id, 16, False) else None
    if spec is None:
        yield f"function id {fn.type_id} is not defined at API level {nnb.api_level}"
        return
    tokens = tokenize_argfmt(spec.argfmt)
    if len(fn.args) != len(tokens):
        want = f"{len(tokens)} encoded arguments ({spec.argfmt!r})"
        yield f"{spec.name} takes {want}, got {len(fn.args)}"
        return
    for arg, token, value in zip(spec.args, tokens, fn.args):
        problem = _arg_problem(token, arg.choices, value)
        if problem:
            yield f"{spec.name} argument {arg.name or '#'} {problem}, got {value!r}"


def _arg_problem(token: str, choices: tuple[str, ...], value: object) -> str | None:
    if token == "iI":
        ok = isinstance(value, tuple) and all(_fits(v, 32, True) for v in value)
        return None if ok else "must be a tuple of int32"
    if token == "i":
        if not _fits(value, 32, True):
            return "must be an int32"
        if choices and not (isinstance(value, int) and 0 <= value < len(choices)):
            return f"must index one of {len(choices)} choices"
        return None
    if token == "B":
        return None if isinstance(value, bool) or _fits(value, 8, False) else "must be 0..255"
    if token == "f":
        return None if _float32_ok(value) else "must be a float32 number"
    return f"has code {token!r}, which .nnb cannot encode"


def _float32_ok(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        struct.pack("<f", value)
    except OverflowError:
        return False
    return True


def _buffer_size_problems(nnb: NnbFile) -> Iterable[str]:
    """Each activation the runtime touches must fit the buffer it lives in."""
    used = set(nnb.inputs) | set(nnb.outputs)
    for fn in nnb.functions:
        used.update(fn.inputs)
        used.update(fn.outputs)
    unit = 4 if nnb.version == 2 else 1
    for n in sorted(used):
        if not 0 <= n < len(nnb.variables):
            continue
        var = nnb.variables[n]
        if var.buffer is None or not 0 <= var.buffer < len(nnb.buffers):
            continue
        have = nnb.buffers[var.buffer] * unit
        need = activation_size(var.dtype, var.size)
        if need > have:
            yield f"variable {n} needs {_amount(need)} bytes but buffer {var.buffer} holds {have}"


# ----------------------------------------------------------------------------- writing


class _Blocks:
    """nnabla's allocator: every block gets the next slot and starts 4-aligned."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.data = bytearray()

    def alloc(self, payload: bytes) -> int:
        self.offsets.append(len(self.data))
        self.data += payload
        self.data += b"\0" * (_align4(len(payload)) - len(payload))
        return len(self.offsets) - 1

    def uint32s(self, values: Sequence[int]) -> int:
        return self.alloc(struct.pack(f"<{len(values)}I", *values))


def write_nnb(nnb: NnbFile, table: FunctionTable | None = None) -> bytes:
    """The file's bytes, blocks in nnabla's order; InternalError if `nnb` is inconsistent."""
    table = table or default_table()
    problems = check_nnb(nnb, table)
    if problems:
        raise InternalError(f"cannot write .nnb: {'; '.join(problems)}")
    blocks = _Blocks()
    inputs = blocks.uint32s(nnb.inputs)
    outputs = blocks.uint32s(nnb.outputs)
    buffers = blocks.uint32s(nnb.buffers)
    var_slots = []
    for n, var in enumerate(nnb.variables):
        shape = blocks.uint32s(var.shape)
        if var.data is not None:
            data_index = blocks.alloc(var.data)
        else:
            assert var.buffer is not None  # check_nnb guarantees one of them
            data_index = -(var.buffer + 1)
        code = bytes([(var.fp_pos << 4) | int(var.dtype), 0, 0, 0])
        var_slots.append(blocks.alloc(VARIABLE.pack(n, len(var.shape), shape, code, data_index)))
    variables = blocks.uint32s(var_slots)
    fn_slots = []
    for fn in nnb.functions:
        fin = blocks.uint32s(fn.inputs)
        fout = blocks.uint32s(fn.outputs)
        spec = table.by_id(fn.type_id, nnb.api_level)
        assert spec is not None
        args = _encode_args(tokenize_argfmt(spec.argfmt), fn.args, blocks)
        head = FUNCTION_HEAD.pack(fn.type_id, fn.impl, len(fn.inputs), fin, len(fn.outputs), fout)
        fn_slots.append(blocks.alloc(head + args))
    functions = blocks.uint32s(fn_slots)
    header = HEADER.pack(
        nnb.version, nnb.api_level,
        len(nnb.buffers), buffers, len(nnb.variables), variables,
        len(nnb.functions), functions, len(nnb.inputs), inputs, len(nnb.outputs), outputs,
        len(blocks.offsets), len(blocks.data),
    )  # fmt: skip
    index = struct.pack(f"<{len(blocks.offsets)}I", *blocks.offsets)
    return header + index + bytes(blocks.data)


def _encode_args(tokens: Sequence[str], values: Sequence[ArgValue], blocks: _Blocks) -> bytes:
    layout, end = _arg_layout(tokens)
    out = bytearray(end)
    for token, offset, value in zip(tokens, layout, values):
        if token == "iI":
            assert isinstance(value, tuple)
            slot = blocks.alloc(struct.pack(f"<{len(value)}i", *value))
            struct.pack_into("<iI", out, offset, len(value), slot)
        else:
            struct.pack_into("<" + token, out, offset, value)
    return bytes(out)


def _arg_layout(tokens: Sequence[str]) -> tuple[list[int], int]:
    """C layout after the 20-byte common part: 4-byte fields aligned, bool bytes packed."""
    offsets = []
    end = 0
    for token in tokens:
        if token != "B":
            end = _align4(end)
        offsets.append(end)
        end += ARG_WIDTH[token]
    return offsets, end


# ----------------------------------------------------------------------------- reading

@attrs.define
class _Reader:
    """Bounds-checked access to the blocks of one file; every failure names the file."""

    raw: bytes
    source: str
    base: int = 0  # start of the data area
    size: int = 0  # data_size
    offsets: tuple[int, ...] = ()
    claims: dict[int, tuple[str, int]] = attrs.field(factory=dict)

    def fail(self, message: str) -> NoReturn:
        raise InvalidInputError(f"{self.source}: invalid .nnb file: {message}")

    def locate(self, slot: int, nbytes: int, what: str) -> int:
        """Absolute offset of block `slot` after checking `nbytes` of it lie in the file."""
        if not 0 <= slot < len(self.offsets):
            self.fail(f"{what} refers to slot {slot}, but the index has {len(self.offsets)} slots")
        offset = self.offsets[slot]
        if offset % 4:
            self.fail(f"{what} (slot {slot}) starts at unaligned offset {offset}")
        if offset + _align4(nbytes) > self.size:
            self.fail(
                f"{what} (slot {slot}) needs {_amount(nbytes)} bytes at offset {offset}, "
                f"past the end of the {self.size}-byte data area"
            )
        return self.base + offset

    def claim(self, slot: int, nbytes: int, kind: str, owner: str) -> int:
        """`locate`, and remember the use: a block may be shared only by uses of one kind."""
        at = self.locate(slot, nbytes, f"{kind} of {owner}")
        previous = self.claims.setdefault(slot, (kind, nbytes))
        if previous != (kind, nbytes):
            self.fail(
                f"slot {slot} is used both as {previous[0]} ({previous[1]} bytes) "
                f"and as {kind} of {owner} ({nbytes} bytes)"
            )
        return at

    def uint32s(self, slot: int, count: int, kind: str, owner: str) -> tuple[int, ...]:
        at = self.claim(slot, 4 * count, kind, owner)
        return struct.unpack_from(f"<{count}I", self.raw, at)

    def zeros(self, at: int, length: int, what: str) -> None:
        if any(self.raw[at : at + length]):
            self.fail(f"nonzero padding in {what}")

    def check_overlaps(self) -> None:
        spans = sorted(
            (self.offsets[slot], _align4(nbytes), kind)
            for slot, (kind, nbytes) in self.claims.items()
            if nbytes
        )
        for (start, length, kind), (nxt, _, other) in itertools.pairwise(spans):
            if start + length > nxt:
                span = f"bytes {start}..{start + length}"
                self.fail(f"a {kind} block ({span}) overlaps a {other} block")


def read_nnb(data: bytes, source: str, table: FunctionTable | None = None) -> NnbFile:
    """Parse and check a .nnb file; InvalidInputError naming `source` on any inconsistency."""
    table = table or default_table()
    r = _Reader(bytes(data), source)
    if len(r.raw) < HEADER.size:
        r.fail(f"{len(r.raw)} bytes is shorter than the {HEADER.size}-byte header")
    (version, api_level, nbuf, sbuf, nvar, svar, nfun, sfun, nin, sin, nout, sout,
     num_data, data_size) = HEADER.unpack_from(r.raw)  # fmt: skip
    if version not in VERSIONS:
        r.fail(f"version {version} is not one of {VERSIONS}")
    if api_level > table.max_level:
        raise UnsupportedError(
            f"{source}: .nnb API level {api_level} is newer than {table.source} knows "
            f"(up to {table.max_level})"
        )
    if api_level < 1:
        r.fail(f"API level {api_level} is not positive")
    expected = HEADER.size + 4 * num_data + data_size
    if expected != len(r.raw):
        r.fail(
            f"header promises {num_data} index entries and {data_size} data bytes "
            f"({expected} bytes in all), but the file has {len(r.raw)} bytes"
        )
    r.base, r.size = HEADER.size + 4 * num_data, data_size
    r.offsets = struct.unpack_from(f"<{num_data}I", r.raw, HEADER.size)

    inputs = r.uint32s(sin, nin, "variable index list", "the network inputs")
    outputs = r.uint32s(sout, nout, "variable index list", "the network outputs")
    buffers = r.uint32s(sbuf, nbuf, "buffer size list", "the network")
    var_slots = r.uint32s(svar, nvar, "variable list", "the network")
    variables = tuple(_read_variable(r, n, slot) for n, slot in enumerate(var_slots))
    fn_slots = r.uint32s(sfun, nfun, "function list", "the network")
    functions = tuple(
        _read_function(r, n, slot, api_level, table) for n, slot in enumerate(fn_slots)
    )
    r.check_overlaps()
    nnb = NnbFile(version, api_level, buffers, variables, functions, inputs, outputs)
    problems = check_nnb(nnb, table)
    if problems:
        more = f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""
        r.fail("; ".join(problems[:10]) + more)
    return nnb


def _read_variable(r: _Reader, n: int, slot: int) -> Variable:
    owner = f"variable {n}"
    at = r.claim(slot, VARIABLE.size, "variable struct", owner)
    vid, ndim, shape_slot, code, data_index = VARIABLE.unpack_from(r.raw, at)
    if vid != n:
        r.fail(f"{owner} has id {vid}; ids must equal positions")
    r.zeros(at + 13, 3, f"the struct of {owner}")
    shape = r.uint32s(shape_slot, ndim, "shape list", owner)
    type_code = code[0] & 0xF
    if type_code >= len(DataType):
        r.fail(f"{owner} has type code {type_code} (known: 0..{len(DataType) - 1})")
    dtype = DataType(type_code)
    fp_pos = code[0] >> 4
    if data_index < 0:
        return Variable(shape, dtype, fp_pos, buffer=-data_index - 1)
    nbytes = payload_size(dtype, math.prod(shape))
    start = r.claim(data_index, nbytes, "parameter data", owner)
    r.zeros(start + nbytes, _align4(nbytes) - nbytes, f"the parameter data of {owner}")
    return Variable(shape, dtype, fp_pos, data=r.raw[start : start + nbytes])


def _read_function(r: _Reader, n: int, slot: int, api_level: int, table: FunctionTable) -> Function:
    owner = f"function {n}"
    at = r.locate(slot, FUNCTION_HEAD.size, f"function struct of {owner}")
    type_id, impl, nin, sin, nout, sout = FUNCTION_HEAD.unpack_from(r.raw, at)
    spec = table.by_id(type_id, api_level)
    if spec is None:
        r.fail(f"{owner} has function id {type_id}, which API level {api_level} does not define")
    tokens = tokenize_argfmt(spec.argfmt)
    if any(t not in ARG_WIDTH for t in tokens):
        r.fail(f"{owner} is {spec.name} (id {type_id}), whose arguments .nnb cannot encode")
    layout, end = _arg_layout(tokens)
    at = r.claim(slot, FUNCTION_HEAD.size + end, f"{spec.name} struct", owner)
    inputs = r.uint32s(sin, nin, "variable index list", owner)
    outputs = r.uint32s(sout, nout, "variable index list", owner)
    body = at + FUNCTION_HEAD.size
    args: list[ArgValue] = []
    padding = bytearray(r.raw[body : body + _align4(end)])
    for token, offset in zip(tokens, layout):
        padding[offset : offset + ARG_WIDTH[token]] = bytes(ARG_WIDTH[token])
        if token == "iI":
            count, array_slot = struct.unpack_from("<iI", r.raw, body + offset)
            if count < 0:
                r.fail(f"{owner} ({spec.name}) has a list argument of negative size {count}")
            start = r.claim(array_slot, 4 * count, "argument array", owner)
            args.append(struct.unpack_from(f"<{count}i", r.raw, start))
        else:
            args.append(struct.unpack_from("<" + token, r.raw, body + offset)[0])
    if any(padding):
        r.fail(f"nonzero padding in the argument struct of {owner} ({spec.name})")
    return Function(type_id, inputs, outputs, tuple(args), impl)
