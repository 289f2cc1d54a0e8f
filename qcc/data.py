"""Calibration/evaluation data files (.npz): arrays keyed by model input name, samples on each
input's samples axis (`qcc.ir.samples`) or stacked on a new leading axis.

No pickles are ever loaded. A file with one array feeds a one-input model whatever its key;
the key `labels` is reserved for top-1 accuracy.
"""

from __future__ import annotations

import os
import tokenize
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
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
    """Match arrays to the model's inputs (checking dtype and shape); returns (feeds, labels).

    The feeds are samples-first (`qcc.ir.samples`): an array holds its samples on its input's
    samples axis, or stacks whole inputs on a new leading axis ((N, *input shape), a static
    input only); either way the feed has the samples on axis 0 (identical arrays when every
    input's samples axis is 0), and `qcc.ir.samples.to_model` gives a runner a batch of them."""
    from qcc.ir.samples import sample_axes

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
    axes = sample_axes(model)
    feeds: dict[str, np.ndarray] = {}
    first: tuple[str, int, str] | None = None
    for value in inputs:
        array = arrays[value.name]
        if array.dtype.kind not in "fiub":
            raise InvalidInputError(f"{source}: array {value.name!r} has dtype {array.dtype}")
        array, where = _samples_first(value, array, axes[value.name], source)
        if array.dtype.kind == "f" and not all_finite(array):
            raise InvalidInputError(f"{source}: array {value.name!r} contains NaN or Inf")
        if first is not None and len(array) != first[1]:
            raise InvalidInputError(
                f"{source}: array {value.name!r} holds {len(array)} sample(s) on {where}, but {first[0]!r} holds "
                f"{first[1]} on {first[2]} (name an input's samples axis with --batch-axis NAME=AXIS)")
        first = first or (value.name, len(array), where)
        feeds[value.name] = array.astype(DTYPES[value.type.dtype], copy=False)
    count = first[1] if first is not None else None
    if labels is not None:
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or (count is not None and len(labels) != count):
            raise InvalidInputError(f"{source}: 'labels' must be a 1-D integer array with one label per sample")
    return feeds, labels


def _samples_first(value: Any, array: np.ndarray, axis: int, source: str) -> tuple[np.ndarray, str]:
    """The array with its samples on axis 0, and where it held them (for error lines)."""
    want = value.type.shape
    static = all(isinstance(d, int) for d in want)
    if static and want and array.ndim == len(want) + 1 and array.shape[1:] == tuple(want):
        # whole inputs stacked on a new leading axis: each is one run's worth of samples
        moved = np.moveaxis(array, 1 + axis, 1)
        return moved.reshape((-1, *moved.shape[2:])), "its new leading axis"
    if array.ndim != len(want) or any(isinstance(d, int) and d != s
                                      for i, (d, s) in enumerate(zip(want, array.shape)) if i != axis):
        stacked = f" or {(-1, *want)} (inputs stacked on a new axis)" if static and want else ""
        raise InvalidInputError(
            f"{source}: array {value.name!r} has shape {array.shape}; the model input is {value.type.shape} "
            f"(samples on axis {axis}{stacked})")
    return (np.moveaxis(array, axis, 0) if axis else array), f"axis {axis}"


def all_finite(array: np.ndarray, chunk: int = 1 << 20) -> bool:
    """np.isfinite(array).all() in chunks: no whole-array temporary (calibration memory stays flat)."""
    flat = array.reshape(-1)
    return all(bool(np.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.size, chunk))


class CalibrationCheck:
    """What makes calibration data useless though it is valid: all zeros, one constant value, or
    subnormal values (no fixed-point or int8 grid fitted to them means anything). One line each.

    Fed batch by batch (`add`), so data streamed from Python is checked like a .npz; arrays are
    read in chunks like `all_finite`: no whole-array temporaries.
    """

    def __init__(self, chunk: int = 1 << 20) -> None:
        self.chunk = chunk
        self.seen: dict[str, _Tally] = {}

    def add(self, feeds: dict[str, np.ndarray]) -> None:
        for name, array in feeds.items():
            if array.dtype.kind != "f" or not array.size:
                continue
            tally = self.seen.setdefault(name, _Tally(float(np.finfo(array.dtype).tiny)))
            flat = array.reshape(-1)
            for i in range(0, flat.size, self.chunk):
                part = flat[i:i + self.chunk]
                tally.low, tally.high = min(tally.low, float(part.min())), max(tally.high, float(part.max()))
                magnitude = np.abs(part)
                tally.subnormal += int(np.count_nonzero((magnitude < tally.tiny) & (magnitude > 0)))
            tally.count += flat.size

    def warnings(self, source: str) -> list[str]:
        lines = []
        for name, t in self.seen.items():
            where = f"{source}: calibration array {name!r}"
            if t.low == t.high == 0.0:
                lines.append(f"{where} is all zeros: the ranges calibrated on it say nothing about real inputs")
            elif t.low == t.high:
                lines.append(f"{where} holds one value ({t.low:g}) in all {t.count} elements: the ranges calibrated "
                             "on it say nothing about real inputs")
            if t.subnormal:
                lines.append(f"{where} holds {t.subnormal} subnormal value(s) (0 < |x| < {t.tiny:.3g}): they are "
                             "below any quantization step; is the data scaled as the model expects?")
        return lines


@attrs.define
class _Tally:
    tiny: float
    low: float = np.inf
    high: float = -np.inf
    subnormal: int = 0
    count: int = 0


def calibration_warnings(feeds: dict[str, np.ndarray], source: str, chunk: int = 1 << 20) -> list[str]:
    """`CalibrationCheck` of arrays held whole (a .npz, a dict)."""
    check = CalibrationCheck(chunk)
    check.add(feeds)
    return check.warnings(source)


def static_batch(model: Model, source: str) -> int | None:
    """The batch every input fixes on its samples axis (a torchvision export's 1), or None when it is free."""
    from qcc.ir.samples import sample_axes, static_sizes

    sizes = static_sizes(model)
    if len(set(sizes.values())) > 1:
        axes = sample_axes(model)
        found = ", ".join(f"{k!r} {v} on axis {axes[k]}" for k, v in sizes.items())
        raise InvalidInputError(f"{source}: model inputs have different static batch sizes ({found}); name each "
                                "input's samples axis with --batch-axis NAME=AXIS")
    return next(iter(sizes.values())) if sizes else None


def batching(model: Model, count: int, wanted: int, source: str, who: str) -> tuple[int, int]:
    """(batch, usable samples) for running `model` on `count` samples in batches of `wanted`.

    A static batch dimension wins; samples beyond a multiple of it are dropped (the caller says so).
    Errors name the data (`source`) and who reads it (`who`: "--eval", "pass 'sensitivity'").
    """
    if count == 0:
        raise InvalidInputError(f"{source}: no samples ({who})")
    batch = static_batch(model, source)
    if batch is None:
        return min(wanted, count), count
    if count < batch:
        raise InvalidInputError(f"{source}: {count} sample(s), but the model's batch dimension is {batch} ({who})")
    return batch, count - count % batch


# ----------------------------------------------------------------------------- Python-native data
class DataStream:
    """Data given as batches: an iterable of dicts of arrays (e.g. a torch DataLoader), or a
    callable returning one (called again for every pass over the data).

    Batches are read one at a time (never all at once); `take(n)` collects the first `n` samples
    for what needs several passes over a few samples (sensitivity).
    """

    def __init__(self, source: Any, name: str, input_names: Sequence[str] = ()) -> None:
        self.source = source
        self.name = name
        self.input_names = tuple(input_names)
        self._used = False

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Each batch as arrays by key (`labels` included when the data has them)."""
        if callable(self.source):
            iterable = self.source()
        elif self._used and iter(self.source) is self.source:
            raise UsageError(f"{self.name}: a one-shot iterator cannot be read twice; pass a list, a DataLoader "
                             "or a callable returning a new iterator")
        else:
            iterable = self.source
        self._used = True
        for item in iterable:
            yield to_arrays(item, self.name, self.input_names)

    def take(self, count: int, model: Model | None = None) -> dict[str, np.ndarray]:
        """The first `count` samples as arrays; with `model`, each batch is bound to its inputs and
        the samples joined on each input's samples axis (`qcc.ir.samples`), else on axis 0."""
        from qcc.ir.samples import to_model

        parts: dict[str, list[np.ndarray]] = {}
        have = 0
        for batch in self.batches():
            if model is not None:
                feeds, labels = bind_inputs(model, batch, self.name)
                batch = {**feeds, **({} if labels is None else {"labels": labels})}
            for key, array in batch.items():
                parts.setdefault(key, []).append(array[: count - have])
            have += len(next(iter(batch.values())))
            if have >= count:
                break
        if not parts:
            raise InvalidInputError(f"{self.name}: no batches")
        joined = {k: np.concatenate(v) for k, v in parts.items()}
        return joined if model is None else to_model(model, joined)


def to_arrays(item: Any, name: str, input_names: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """One batch as numpy arrays: a dict, a (inputs..., labels) tuple as a DataLoader of a
    TensorDataset yields, or one array; torch tensors are converted."""
    if isinstance(item, dict):
        return {str(k): _numpy(v, name) for k, v in item.items()}
    if isinstance(item, (tuple, list)):
        arrays = [_numpy(v, name) for v in item]
        inputs = list(input_names) or [f"input{i}" for i in range(len(arrays))]
        if len(arrays) == len(inputs) + 1:
            return {**dict(zip(inputs, arrays[:-1])), "labels": arrays[-1]}
        if len(arrays) == len(inputs):
            return dict(zip(inputs, arrays))
        raise InvalidInputError(f"{name}: a batch of {len(arrays)} items for a model with {len(inputs)} input(s) "
                                "(expected the inputs, optionally followed by labels)")
    array = _numpy(item, name)
    return {input_names[0] if input_names else "input0": array}


def _numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise InvalidInputError(f"{name}: a batch holds Python objects, not arrays")
    return array


def open_data(data: Any, what: str, input_names: Sequence[str] = ()) -> tuple[dict[str, np.ndarray] | DataStream, str]:
    """Calibration/evaluation data as given to qcc.compile: a path (.npz), a dict of arrays, an
    iterable of batches or a callable returning one. Returns (arrays or a stream, its name)."""
    if isinstance(data, (str, os.PathLike)):
        return load_npz(data), os.fspath(data)
    if isinstance(data, dict):
        return {str(k): _numpy(v, what) for k, v in data.items()}, f"{what} (dict)"
    if callable(data) or hasattr(data, "__iter__"):
        name = f"{what} ({type(data).__name__})"
        return DataStream(data, name, input_names), name
    raise UsageError(f"{what}: expected a .npz path, a dict of arrays, an iterable of batches or a callable "
                     f"returning one; got {type(data).__name__}")


def bound_batches(model: Model, data: dict[str, np.ndarray] | DataStream, source: str, batch: int,
                  who: str) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
    """(feeds, labels) in batches of `batch` samples (a static batch dimension wins), checked by
    `bind_inputs`, each batch in the model's layout (`qcc.ir.samples.to_model`); a stream is
    re-cut batch by batch, never held whole."""
    if isinstance(data, dict):
        feeds, labels = bind_inputs(model, data, source)
        yield from cut_batches(model, feeds, labels, source, batch, who)
        return
    from qcc.ir.samples import to_model

    fixed = static_batch(model, source)
    size = fixed or batch
    pending: list[tuple[dict[str, np.ndarray], np.ndarray | None]] = []
    held = 0
    for arrays in data.batches():
        feeds, labels = bind_inputs(model, arrays, source)
        pending.append((feeds, labels))
        held += len(next(iter(feeds.values())))
        while held >= size or (fixed is None and pending and held):
            (out, out_labels), pending, held = _cut(pending, size if fixed else held)
            yield to_model(model, out), out_labels
    if held and fixed is None:
        (out, out_labels), pending, held = _cut(pending, held)
        yield to_model(model, out), out_labels


def cut_batches(model: Model, feeds: dict[str, np.ndarray], labels: np.ndarray | None, source: str, batch: int,
                who: str) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
    """Samples-first feeds (`bind_inputs`) in batches of `batch` (a static batch wins), each in the
    model's layout."""
    from qcc.ir.samples import to_model

    count = len(next(iter(feeds.values()))) if feeds else 0
    size, usable = batching(model, count, batch, source, who)
    for start in range(0, usable, size):
        yield (to_model(model, {k: v[start:start + size] for k, v in feeds.items()}),
               None if labels is None else labels[start:start + size])


def _cut(pending: list[tuple[dict[str, np.ndarray], np.ndarray | None]], size: int) -> tuple[
        tuple[dict[str, np.ndarray], np.ndarray | None], list[tuple[dict[str, np.ndarray], np.ndarray | None]], int]:
    """The first `size` samples of the pending batches, and what is left."""
    feeds = {k: np.concatenate([p[0][k] for p in pending]) for k in pending[0][0]}
    labelled = all(p[1] is not None for p in pending)
    labels = np.concatenate([p[1] for p in pending if p[1] is not None]) if labelled else None
    head = ({k: v[:size] for k, v in feeds.items()}, None if labels is None else labels[:size])
    rest_count = len(next(iter(feeds.values()))) - size
    rest = [({k: v[size:] for k, v in feeds.items()}, None if labels is None else labels[size:])] if rest_count else []
    return head, rest, rest_count
