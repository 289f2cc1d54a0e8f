"""Every tensor of an ONNX model, read exactly and only from the model's own bytes or folder.

ONNX can store a tensor's bytes in another file (`data_location: EXTERNAL`) anywhere a tensor
appears: initializers, sparse initializers, a Constant's or ConstantOfShape's attribute, tensors
inside If/Loop/Scan subgraphs, functions and training graphs. onnx's own helpers resolve such a
location against the *current directory* and follow it wherever it points. qcc resolves every one
of them here, once, right after parsing: inside the model's folder (symlinks resolved first), a
regular file, the declared byte count checked against the limits before anything is read. The
bytes are then moved into the tensor itself, so nothing later can reach the file system again.

Element types are decoded exactly: onnx 1.17's `to_array` reads bfloat16 only from `int32_data`
(a bfloat16 tensor with `raw_data` comes back as uninitialized memory) and returns bfloat16/float8
as raw bit patterns; qcc turns them into the float32 values they denote (exact: every bfloat16 and
float8 value is a float32 value), int4/uint4 into int8/uint8, and refuses what it cannot represent
by name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from qcc import limits
from qcc.errors import InvalidInputError, UnsupportedError
from qcc.io import read_regular_file

# TensorProto.DataType codes (stable across onnx releases; spelled out so that this module
# documents exactly what it decodes)
FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, STRING, BOOL, FLOAT16, DOUBLE = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
UINT32, UINT64, COMPLEX64, COMPLEX128, BFLOAT16 = 12, 13, 14, 15, 16
FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, UINT4, INT4 = 17, 18, 19, 20, 21, 22
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL

TYPE_NAMES = {
    FLOAT: "float32", UINT8: "uint8", INT8: "int8", UINT16: "uint16", INT16: "int16", INT32: "int32",
    INT64: "int64", STRING: "string", BOOL: "bool", FLOAT16: "float16", DOUBLE: "float64", UINT32: "uint32",
    UINT64: "uint64", COMPLEX64: "complex64", COMPLEX128: "complex128", BFLOAT16: "bfloat16",
    FLOAT8E4M3FN: "float8e4m3fn", FLOAT8E4M3FNUZ: "float8e4m3fnuz", FLOAT8E5M2: "float8e5m2",
    FLOAT8E5M2FNUZ: "float8e5m2fnuz", UINT4: "uint4", INT4: "int4",
}  # fmt: skip
REFUSED = (STRING, COMPLEX64, COMPLEX128)
FLOAT8 = {FLOAT8E4M3FN: (True, False), FLOAT8E4M3FNUZ: (True, True), FLOAT8E5M2: (False, False),
          FLOAT8E5M2FNUZ: (False, True)}  # code -> (e4m3?, uz)
# bits of one stored element, for the declared size of raw bytes
_ELEMENT_BITS = {FLOAT: 32, UINT8: 8, INT8: 8, UINT16: 16, INT16: 16, INT32: 32, INT64: 64, BOOL: 8, FLOAT16: 16,
                 DOUBLE: 64, UINT32: 32, UINT64: 64, BFLOAT16: 16, UINT4: 4, INT4: 4,
                 **{code: 8 for code in FLOAT8}}  # fmt: skip


def type_name(code: int) -> str:
    return TYPE_NAMES.get(code, f"element type {code}")


def declared_bytes(tensor: Any) -> int:
    """Bytes the tensor's dims and element type declare (what a reader would allocate)."""
    count = math.prod(int(d) for d in tensor.dims)
    bits = _ELEMENT_BITS.get(tensor.data_type, 64)
    return (count * bits + 7) // 8


# ----------------------------------------------------------------------------- walking
def iter_tensors(proto: Any) -> Iterator[tuple[Any, str]]:
    """Every TensorProto in a ModelProto, each with a label naming where it sits."""
    graphs: list[tuple[Any, str]] = [(proto.graph, "")]
    for function in proto.functions:
        for node in function.node:
            yield from _node_tensors(node, f"function {function.name!r}: ", graphs)
    for index, info in enumerate(proto.training_info):
        graphs.append((info.initialization, f"training_info[{index}].initialization: "))
        graphs.append((info.algorithm, f"training_info[{index}].algorithm: "))
    while graphs:  # an explicit stack: subgraphs nest as deep as the file says
        graph, prefix = graphs.pop()
        for tensor in graph.initializer:
            yield tensor, f"{prefix}initializer {tensor.name!r}"
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            yield sparse.values, f"{prefix}sparse initializer {name!r} (values)"
            yield sparse.indices, f"{prefix}sparse initializer {name!r} (indices)"
        for node in graph.node:
            yield from _node_tensors(node, prefix, graphs)


def _node_tensors(node: Any, prefix: str, graphs: list[tuple[Any, str]]) -> Iterator[tuple[Any, str]]:
    for attribute in node.attribute:
        where = f"{prefix}attribute {attribute.name!r} of node {node.name!r} ({node.op_type})"
        if attribute.HasField("t"):
            yield attribute.t, where
        for index, tensor in enumerate(attribute.tensors):
            yield tensor, f"{where}[{index}]"
        sparse = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
        for index, item in enumerate([*sparse, *attribute.sparse_tensors]):
            yield item.values, f"{where} (sparse values {index})"
            yield item.indices, f"{where} (sparse indices {index})"
        if attribute.HasField("g"):
            graphs.append((attribute.g, f"{where} subgraph: "))
        for index, graph in enumerate(attribute.graphs):
            graphs.append((graph, f"{where} subgraph {index}: "))


# ----------------------------------------------------------------------------- external data
def resolve_external_data(proto: Any, model_path: str | os.PathLike[str] | None, source: str) -> None:
    """Move every externally stored tensor's bytes into the tensor, or refuse it (exit 3).

    `model_path` None (a model built in memory) has no folder: any external reference is refused.
    """
    lim = limits.current()
    base = os.path.realpath(Path(model_path).parent) if model_path is not None else None
    total = 0
    for tensor, where in iter_tensors(proto):
        if tensor.data_location != EXTERNAL:
            if len(tensor.external_data):
                del tensor.external_data[:]  # ignored by ONNX; dropped so no helper ever follows it
            continue
        size = declared_bytes(tensor)
        limits.check_elements(math.prod(int(d) for d in tensor.dims), where, source)
        total += size
        if total > lim.max_parameter_bytes:
            raise InvalidInputError(f"{source}: {where}: external data adds up to {total} bytes, over the limit of "
                                    f"{lim.max_parameter_bytes} (raise it with --limit max_parameter_bytes=N)")
        tensor.raw_data = _read_external(tensor, base, size, where, source)
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            tensor.ClearField(field)
        del tensor.external_data[:]
        tensor.data_location = 0  # DEFAULT


def _read_external(tensor: Any, base: str | None, size: int, where: str, source: str) -> bytes:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if base is None:
        raise InvalidInputError(f"{source}: {where} refers to external data {location!r}, but the model has no "
                                "folder to read it from")
    if not location or "\0" in location or os.path.isabs(location):
        raise InvalidInputError(f"{source}: {where}: external data location {location[:80]!r} is not a relative "
                                "path inside the model's folder")
    target = os.path.realpath(os.path.join(base, location))  # symlinks resolved before the check
    if os.path.commonpath([base, target]) != base or target == base:
        raise InvalidInputError(f"{source}: {where}: external data {location[:80]!r} lies outside the model's "
                                "folder")
    numbers = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is not None and not (text.isascii() and text.isdigit()):
            raise InvalidInputError(f"{source}: {where}: external data {key} {text[:40]!r} is not a byte count")
        numbers[key] = int(text) if text is not None else None
    length = numbers["length"] if numbers["length"] is not None else size
    if length != size:
        raise InvalidInputError(f"{source}: {where}: external data length {length} does not match the "
                                f"{size} bytes its dims and type declare")
    return read_regular_file(target, limits.current().max_parameter_bytes, f"external data of {where}",
                             offset=numbers["offset"] or 0, length=length)


# ----------------------------------------------------------------------------- decoding
def _from_raw(raw: bytes, code: int, shape: tuple[int, ...]) -> np.ndarray | None:
    """What onnx.numpy_helper.to_array returns for raw_data of a plain numeric type on a
    little-endian host (np.frombuffer over the bytes), from bytes already read; None for the types
    it converts (strings, and the ones to_array decodes above)."""
    import sys

    from onnx import TensorProto, helper

    if sys.byteorder != "little" or code in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    return np.frombuffer(raw, dtype=helper.tensor_dtype_to_np_dtype(code)).reshape(shape)


def to_array(tensor: Any, where: str, source: str) -> np.ndarray:
    """The exact values of a tensor (after `resolve_external_data`), as a numpy array qcc handles."""
    code = tensor.data_type
    if tensor.data_location == EXTERNAL:  # resolve_external_data runs first; never read a file here
        raise InvalidInputError(f"{source}: {where} still refers to external data")
    if code in REFUSED or code not in TYPE_NAMES:
        raise UnsupportedError(f"{source}: {where} has element type {type_name(code)}, which qcc does not handle")
    shape = tuple(int(d) for d in tensor.dims)
    count = math.prod(shape)
    try:
        if code == BFLOAT16:
            bits = _bits(tensor, count, np.uint16, where, source)
            return (bits.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if code == BOOL:  # one byte per value; anything but 0 and 1 is not a bool (readers disagree on it)
            bits = _bits(tensor, count, np.uint8, where, source)
            if bits.size and int(bits.max()) > 1:
                raise InvalidInputError(f"{source}: {where} is bool but holds byte value {int(bits.max())} "
                                        "(only 0 and 1 are booleans)")
            return bits.astype(bool).reshape(shape)
        if code in FLOAT8:
            bits = _bits(tensor, count, np.uint8, where, source)
            return _float8_table(code)[bits].reshape(shape)
        if code in (INT4, UINT4):
            from onnx.numpy_helper import unpack_int4

            packed = _bits(tensor, (count + 1) // 2, np.uint8, where, source)
            unpacked = unpack_int4(packed, dims=shape, signed=code == INT4)
            return np.asarray(unpacked).astype(np.int8 if code == INT4 else np.uint8)
        from onnx.numpy_helper import to_array as onnx_to_array

        array = None
        if tensor.HasField("raw_data"):
            raw = tensor.raw_data  # protobuf copies a bytes field on every read: read it once
            if len(raw) != declared_bytes(tensor):
                raise InvalidInputError(f"{source}: {where} has {len(raw)} bytes of data for shape "
                                        f"{shape} of {type_name(code)} ({declared_bytes(tensor)} bytes)")
            if not tensor.HasField("segment"):  # (to_array refuses segments)
                array = _from_raw(raw, code, shape)
        if array is None:
            array = np.asarray(onnx_to_array(tensor))
        if array.size != count:
            raise InvalidInputError(f"{source}: {where} has {array.size} values for shape {shape}")
        return array
    except (InvalidInputError, UnsupportedError):
        raise
    except Exception as exc:
        raise InvalidInputError(f"{source}: {where} is corrupt: {type(exc).__name__}: {str(exc)[:200]}") from None


def _bits(tensor: Any, count: int, dtype: type, where: str, source: str) -> np.ndarray:
    """The stored bit patterns of a small-float or packed tensor, from raw_data or int32_data."""
    itemsize = np.dtype(dtype).itemsize
    if tensor.HasField("raw_data"):
        if len(tensor.raw_data) != count * itemsize:
            raise InvalidInputError(f"{source}: {where} has {len(tensor.raw_data)} bytes of data, its dims and "
                                    f"type declare {count * itemsize}")
        return np.frombuffer(tensor.raw_data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    if len(tensor.int32_data) != count:
        raise InvalidInputError(f"{source}: {where} has {len(tensor.int32_data)} values, its dims declare {count}")
    values = np.asarray(tensor.int32_data, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() > np.iinfo(dtype).max):
        raise InvalidInputError(f"{source}: {where} holds values outside the {np.dtype(dtype).name} bit patterns")
    return values.astype(dtype)


_TABLES: dict[int, np.ndarray] = {}


def _float8_table(code: int) -> np.ndarray:
    """float32 value of each of the 256 bit patterns (onnx's own scalar decoder, once per type)."""
    if code not in _TABLES:
        from onnx.numpy_helper import float8e4m3_to_float32, float8e5m2_to_float32

        e4m3, uz = FLOAT8[code]
        bits = np.arange(256, dtype=np.uint8)
        if e4m3:
            table = float8e4m3_to_float32(bits, fn=True, uz=uz)
        else:
            table = float8e5m2_to_float32(bits, fn=uz, uz=uz)
        _TABLES[code] = np.asarray(table, dtype=np.float32).reshape(256)
    return _TABLES[code]


def decode_array(array: np.ndarray) -> np.ndarray:
    """An array from onnx's reference evaluator with its bit-pattern dtypes turned into values."""
    names = array.dtype.names
    if not names:
        return array
    kind = names[0]
    bits = array.view(array.dtype.base) if array.dtype.base != array.dtype else array
    if kind == "bfloat16":
        return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    codes = {"e4m3fn": FLOAT8E4M3FN, "e4m3fnuz": FLOAT8E4M3FNUZ, "e5m2": FLOAT8E5M2, "e5m2fnuz": FLOAT8E5M2FNUZ}
    if kind in codes:
        return _float8_table(codes[kind])[np.asarray(bits, dtype=np.uint8)]
    if kind == "int4":
        return np.asarray(bits).astype(np.int8)
    if kind == "uint4":
        return np.asarray(bits).astype(np.uint8)
    raise UnsupportedError(f"element type {kind} is not supported")
