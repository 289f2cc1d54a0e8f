"""Reading .nnp archives (and bare .nntxt files) without trusting them.

An .nnp is a zip of a network definition (.nntxt text protobuf, or .protobuf), parameters
(.h5 or .protobuf) and a version file. Every member is read in memory: nothing is extracted, and
the archive is checked by `qcc.archive` before any member is inflated (paths, member count, total
size, compression ratio). Declared parameter shapes are checked against the limits before a
parameter is read.
"""

from __future__ import annotations

import io
import os
import posixpath
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from qcc import archive, limits
from qcc.errors import InvalidInputError
from qcc.io import quiet_native_stderr, read_regular_file, require_regular_file

NETWORK_EXTS = (".nntxt", ".prototxt")
PARAM_EXTS = (".h5", ".protobuf")


@attrs.define
class NnpContents:
    """The merged NNablaProtoBuf message plus parameter arrays keyed by variable name."""

    proto: Any
    params: dict[str, np.ndarray]
    members: list[str]


@attrs.define
class ParamBudget:
    """The running total of parameter bytes over every member and dataset of one archive."""

    source: str
    total: int = 0
    objects: int = 0

    def add(self, nbytes: int, where: str) -> None:
        self.total += nbytes
        limit = limits.current().max_parameter_bytes
        if self.total > limit:
            raise InvalidInputError(f"{where}: parameters add up to {self.total} bytes, over the limit of {limit} "
                                    "(raise it with --limit max_parameter_bytes=N)")

    def count_object(self, where: str) -> None:
        self.objects += 1
        limit = limits.current().max_archive_members * 10
        if self.objects > limit:
            raise InvalidInputError(f"{where}: more than {limit} HDF5 objects")


def _read_members(path: Path, max_members: int, max_total: int) -> tuple[dict[str, bytes], list[str]]:
    """The network and parameter members' bytes, and every member's name."""
    source = str(path)
    if not zipfile.is_zipfile(path):
        raise InvalidInputError(f"{source}: not an .nnp file (not a zip archive)")
    with archive.reading(source, ".nnp"), zipfile.ZipFile(path) as zf:
        infos = archive.checked_members(zf, source, max_total)
        if len(infos) > max_members:
            raise InvalidInputError(f"{source}: archive has {len(infos)} members, over the limit of {max_members}")
        # only the members qcc reads are inflated: anything else in the archive stays compressed
        wanted = [info for info in infos if not info.is_dir() and
                  posixpath.splitext(info.filename)[1].lower() in NETWORK_EXTS + PARAM_EXTS]
        names = sorted(info.filename for info in infos if not info.is_dir())
        return {info.filename: archive.read_member(zf, info, source) for info in wanted}, names


def _merge_text(proto: Any, text: bytes, where: str) -> None:
    from google.protobuf import text_format

    try:
        text_format.Merge(text.decode("utf-8"), proto)
    except (UnicodeDecodeError, text_format.ParseError) as exc:
        raise InvalidInputError(f"{where}: not a valid nntxt network definition: {exc}") from None


def _merge_binary(proto: Any, data: bytes, where: str) -> None:
    from google.protobuf.message import DecodeError

    try:
        with quiet_native_stderr():  # libprotobuf logs bad UTF-8 straight to fd 2; the error says it all
            proto.MergeFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInputError(f"{where}: corrupt protobuf: {exc}") from None


def _h5_params(data: bytes, where: str, budget: ParamBudget) -> dict[str, np.ndarray]:
    """Datasets of an nnabla parameter .h5, in nnabla's saved order (the 'index' attribute).

    Only the archive member's own bytes are read. HDF5 can point outside a file in three ways,
    each refused before any data is read: external links, datasets with external raw storage
    (`external=[(path, offset, size)]`, resolved against the current directory), and virtual
    datasets (mapped from other files). Soft links are refused too (nnabla never writes them),
    and hard-link cycles are walked once.
    """
    import h5py

    found: list[tuple[int, str, np.ndarray]] = []
    try:
        with h5py.File(io.BytesIO(data), "r") as handle:
            seen: set[int] = set()
            stack: list[tuple[str, Iterator[str], Any]] = [("", iter(list(handle)), handle)]
            while stack:  # depth first, in the file's name order (what h5py's visititems does)
                prefix, keys, group = stack[-1]
                key = next(keys, None)
                if key is None:
                    stack.pop()
                    continue
                name = f"{prefix}{key}"
                link = group.get(key, getlink=True)
                if not isinstance(link, h5py.HardLink):
                    raise InvalidInputError(f"{where}: {name!r} is an HDF5 {type(link).__name__}; parameters "
                                            "must be stored in the archive itself")
                obj = group[key]
                address = h5py.h5o.get_info(obj.id).addr
                if address in seen:
                    continue
                seen.add(address)
                budget.count_object(where)
                if isinstance(obj, h5py.Group):
                    stack.append((name + "/", iter(list(obj)), obj))
                elif isinstance(obj, h5py.Dataset):
                    budget.add(_check_dataset(obj, name, where), where)
                    index = obj.attrs.get("index", len(found))
                    found.append((int(index) if np.ndim(index) == 0 else len(found), name, np.asarray(obj[...])))
    except InvalidInputError:
        raise
    except Exception as exc:  # libhdf5 reports a corrupt file with many exception types
        raise InvalidInputError(f"{where}: corrupt parameter .h5: {type(exc).__name__}: {str(exc)[:300]}") from None
    return {name: array for _, name, array in sorted(found, key=lambda t: t[0])}


def _check_dataset(obj: Any, name: str, where: str) -> int:
    """Refuse a dataset that would read outside the archive or over the limits; its byte count."""
    if obj.external:
        raise InvalidInputError(f"{where}: parameter {name!r} keeps its data in an external file "
                                f"({str(obj.external[0][0])[:80]!r}); only the archive's own bytes are read")
    if obj.is_virtual:
        raise InvalidInputError(f"{where}: parameter {name!r} is an HDF5 virtual dataset (mapped from other "
                                "files); only the archive's own bytes are read")
    if obj.dtype.kind not in "fiub":  # no strings, references, compounds or object data
        raise InvalidInputError(f"{where}: parameter {name!r} has dtype {obj.dtype}")
    # the declared shape is checked before reading: a chunked, compressed dataset can be a bomb
    count = int(np.prod(obj.shape, dtype=np.float64))
    limits.check_tensor(count, obj.dtype.itemsize, f"parameter {name!r}", where)
    return count * obj.dtype.itemsize


def _proto_params(proto: Any, where: str, budget: ParamBudget) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for p in proto.parameter:
        shape = tuple(int(d) for d in p.shape.dim)
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"{where}: parameter {p.variable_name!r} has a negative dimension in {shape}")
        count = int(np.prod(shape, dtype=np.float64))
        limits.check_tensor(count, 4, f"parameter {p.variable_name!r}", where)
        budget.add(count * 4, where)
        data = np.asarray(p.data, dtype=np.float32)
        if data.size != int(np.prod(shape, dtype=np.int64)):
            raise InvalidInputError(
                f"{where}: parameter {p.variable_name!r} has {data.size} values for shape {shape}")
        out[p.variable_name] = data.reshape(shape)
    return out


def read_nnp(path: str | os.PathLike[str], max_members: int | None = None,
             max_total_bytes: int | None = None) -> NnpContents:
    """Parse an .nnp archive or a bare .nntxt file into the merged proto and its parameters.

    The member and size caps default to the `max_archive_members` / `max_archive_bytes` limits.
    """
    from nnabla.utils import nnabla_pb2

    lim = limits.current()
    max_members = max_members or lim.max_archive_members
    max_total_bytes = max_total_bytes or lim.max_archive_bytes
    source = Path(path)
    proto = nnabla_pb2.NNablaProtoBuf()
    params: dict[str, np.ndarray] = {}
    require_regular_file(source, "model")
    if source.suffix.lower() in NETWORK_EXTS and not zipfile.is_zipfile(source):
        _merge_text(proto, read_regular_file(source, max_total_bytes, "network definition"), str(source))
        params.update(_proto_params(proto, str(source), ParamBudget(str(source))))
        return NnpContents(proto, params, [source.name])
    members, names = _read_members(source, max_members, max_total_bytes)
    budget = ParamBudget(str(source))
    for name in members:
        if posixpath.splitext(name)[1].lower() in NETWORK_EXTS:
            _merge_text(proto, members[name], f"{source}:{name}")
    for name, data in members.items():
        ext = posixpath.splitext(name)[1].lower()
        where = f"{source}:{name}"
        if ext == ".h5":
            params.update(_h5_params(data, where, budget))
        elif ext == ".protobuf":
            part = nnabla_pb2.NNablaProtoBuf()
            _merge_binary(part, data, where)
            params.update(_proto_params(part, where, budget))
            for network in part.network:
                proto.network.add().CopyFrom(network)
            for executor in part.executor:
                proto.executor.add().CopyFrom(executor)
    if not proto.network:
        raise InvalidInputError(
            f"{source}: not an .nnp file: no network definition among its members {names[:10]}")
    params.update({k: v for k, v in _proto_params(proto, str(source), budget).items() if k not in params})
    return NnpContents(proto, params, names)


def _param_fields() -> dict[str, str]:
    from nnabla.utils import nnabla_pb2

    oneof = nnabla_pb2.Function.DESCRIPTOR.oneofs_by_name["parameter"]
    return {f.name[: -len("_param")].replace("_", ""): f.name for f in oneof.fields}


def param_field(function_type: str) -> str | None:
    """Name of the Function message field holding `function_type`'s arguments (None: it has none)."""
    global _FIELDS
    if _FIELDS is None:
        _FIELDS = _param_fields()
    return _FIELDS.get(function_type.lower())


_FIELDS: dict[str, str] | None = None


def function_args(function: Any) -> Any:
    """The argument message of a Function (a default instance when the file left it out)."""
    name = function.WhichOneof("parameter") or param_field(function.type)
    return getattr(function, name) if name else None
