"""Calibration/evaluation data files (.npz): arrays keyed by model input name, samples first.

No pickles are ever loaded. A file with one array feeds a one-input model whatever its key;
the key `labels` is reserved for top-1 accuracy.
"""

from __future__ import annotations

import os
import tokenize
import zipfile
from pathlib import Path

import numpy as np

from qcc import archive, limits
from qcc.errors import InvalidInputError, UsageError
from qcc.io import require_regular_file
from qcc.ir.core import Model
from qcc.ir.types import DTYPES


def load_npz(path: str | os.PathLike[str], max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Read arrays without unpickling; the archive and each .npy header are checked before inflating."""
    source = Path(path)
    text = str(source)
    if not os.path.lexists(source):
        raise UsageError(f"{source}: no such file")
    require_regular_file(source, "data file")  # a FIFO would block zipfile's open, a device never end
    try:
        with archive.reading(text, ".npz"), zipfile.ZipFile(source) as zf:
            arrays: dict[str, np.ndarray] = {}
            for info in archive.checked_members(zf, text, max_bytes):
                if not info.filename.endswith(".npy"):
                    raise InvalidInputError(f"{source}: member {info.filename!r} is not a .npy array")
                arrays[info.filename[:-4]] = _read_member(zf, info, text)
            return arrays
    except InvalidInputError:
        raise
    except (KeyError, SyntaxError, TypeError, tokenize.TokenError) as exc:  # numpy's header parsing
        raise InvalidInputError(f"{source}: not a readable .npz file ({type(exc).__name__}: {exc})") from None


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, source: str) -> np.ndarray:
    """One .npy member: the header is checked against the member's size before any allocation."""
    fmt = np.lib.format
    with zf.open(info) as member:
        version = fmt.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(member)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(member)
        else:
            raise InvalidInputError(f"{source}: member {info.filename!r} has .npy format version {version}")
        if dtype.hasobject:
            raise InvalidInputError(f"{source}: member {info.filename!r} holds Python objects (pickles are refused)")
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"{source}: member {info.filename!r} declares shape {shape}")
        count = int(np.prod(shape, dtype=np.float64))
        limits.check_elements(count, f"array {info.filename!r}", source)
        if count * dtype.itemsize > info.file_size:
            raise InvalidInputError(f"{source}: member {info.filename!r} declares {shape} but holds {info.file_size} bytes")
        data = member.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise InvalidInputError(f"{source}: member {info.filename!r} is truncated")
    array = np.frombuffer(data, dtype=dtype)
    array = array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)
    return np.array(array)


def bind_inputs(model: Model, arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Match arrays to the model's inputs (checking dtype and shape); returns (feeds, labels)."""
    arrays = dict(arrays)
    labels = arrays.pop("labels", None)
    inputs = model.graph.inputs
    if len(inputs) == 1 and len(arrays) == 1 and inputs[0].name not in arrays:
        arrays = {inputs[0].name: next(iter(arrays.values()))}
    missing = [v.name for v in inputs if v.name not in arrays]
    if missing:
        raise InvalidInputError(f"{source}: no array for model input(s) {missing} (file has {sorted(arrays)})")
    extra = sorted(set(arrays) - {v.name for v in inputs})
    if extra:
        raise InvalidInputError(f"{source}: arrays {extra} match no model input (inputs: {[v.name for v in inputs]})")
    feeds: dict[str, np.ndarray] = {}
    count = None
    for value in inputs:
        array = arrays[value.name]
        if array.dtype.kind not in "fiub":
            raise InvalidInputError(f"{source}: array {value.name!r} has dtype {array.dtype}")
        want = value.type.shape
        if array.ndim != len(want) or any(isinstance(d, int) and d != s for d, s in zip(want[1:], array.shape[1:])):
            raise InvalidInputError(
                f"{source}: array {value.name!r} has shape {array.shape}; the model input is {value.type.shape} (first axis = samples)")
        if array.dtype.kind == "f" and not all_finite(array):
            raise InvalidInputError(f"{source}: array {value.name!r} contains NaN or Inf")
        if count is not None and len(array) != count:
            raise InvalidInputError(f"{source}: arrays have different sample counts")
        count = len(array)
        feeds[value.name] = array.astype(DTYPES[value.type.dtype], copy=False)
    if labels is not None:
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or (count is not None and len(labels) != count):
            raise InvalidInputError(f"{source}: 'labels' must be a 1-D integer array with one label per sample")
    return feeds, labels


def all_finite(array: np.ndarray, chunk: int = 1 << 20) -> bool:
    """np.isfinite(array).all() in chunks: no whole-array temporary (calibration memory stays flat)."""
    flat = array.reshape(-1)
    return all(bool(np.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.size, chunk))


def calibration_warnings(feeds: dict[str, np.ndarray], source: str, chunk: int = 1 << 20) -> list[str]:
    """What makes calibration data useless though it is valid: all zeros, one constant value, or
    subnormal values (no fixed-point or int8 grid fitted to them means anything). One line each.

    Read in chunks like `all_finite`: no whole-array temporaries.
    """
    warnings = []
    for name, array in feeds.items():
        if array.dtype.kind != "f" or not array.size:
            continue
        flat = array.reshape(-1)
        low, high = np.inf, -np.inf
        subnormal = 0
        tiny = np.finfo(array.dtype).tiny
        for i in range(0, flat.size, chunk):
            part = flat[i:i + chunk]
            low, high = min(low, float(part.min())), max(high, float(part.max()))
            magnitude = np.abs(part)
            subnormal += int(np.count_nonzero((magnitude < tiny) & (magnitude > 0)))
        where = f"{source}: calibration array {name!r}"
        if low == high == 0.0:
            warnings.append(f"{where} is all zeros: the ranges calibrated on it say nothing about real inputs")
        elif low == high:
            warnings.append(f"{where} holds one value ({low:g}) in all {flat.size} elements: the ranges calibrated "
                            "on it say nothing about real inputs")
        if subnormal:
            warnings.append(f"{where} holds {subnormal} subnormal value(s) (0 < |x| < {tiny:.3g}): they are "
                            "below any quantization step; is the data scaled as the model expects?")
    return warnings
