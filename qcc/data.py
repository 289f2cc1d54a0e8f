"""Calibration/evaluation data files (.npz): arrays keyed by model input name, samples first.

No pickles are ever loaded. A file with one array feeds a one-input model whatever its key;
the key `labels` is reserved for top-1 accuracy.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from qcc.errors import InvalidInputError
from qcc.ir.core import Model
from qcc.ir.types import DTYPES

MAX_DATA_BYTES = 4 * 1024**3


def load_npz(path: str | os.PathLike[str], max_bytes: int = MAX_DATA_BYTES) -> dict[str, np.ndarray]:
    source = Path(path)
    try:
        with zipfile.ZipFile(source) as zf:
            total = sum(info.file_size for info in zf.infolist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(f"{source}: not a readable .npz file ({exc})") from None
    if total > max_bytes:
        raise InvalidInputError(f"{source}: {total} bytes uncompressed is over the {max_bytes}-byte limit")
    try:
        with np.load(source, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except ValueError as exc:
        raise InvalidInputError(f"{source}: {exc} (object arrays/pickles are refused)") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise InvalidInputError(f"{source}: corrupt .npz member ({exc})") from None


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
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidInputError(f"{source}: array {value.name!r} contains NaN or Inf")
        if count is not None and len(array) != count:
            raise InvalidInputError(f"{source}: arrays have different sample counts")
        count = len(array)
        feeds[value.name] = array.astype(DTYPES[value.type.dtype], copy=False)
    if labels is not None:
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or (count is not None and len(labels) != count):
            raise InvalidInputError(f"{source}: 'labels' must be a 1-D integer array with one label per sample")
    return feeds, labels
