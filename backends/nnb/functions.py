"""qcc's table of NNabla functions for .nnb: ids and argument encodings per API level.

The ids and argument codes are nnabla's (its converter pickles them in `functions.pkl`). When
nnabla is installed qcc reads that table, so qcc and the user's `nnabla_cli` agree; otherwise it
uses the copy committed in `_function_table.py` (regenerate it with `gen_function_table.py`
after upgrading nnabla; a test checks the two agree). Which functions nnabla-c-runtime really
implements is not in nnabla's table (its `c_runtime` flags are wrong for AddN, MulN, Trilu,
TensorNormalization and Pad), so that list is kept here by hand from the runtime's sources.
"""

from __future__ import annotations

import collections
import functools
import importlib.metadata
import importlib.util
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from qcc.errors import UnsupportedError, UsageError

# One pack code per nnabla argument type (nnabla.utils.converter.type_to_pack_format). A pair
# ("iI") is {int32 size; uint32 slot} pointing at an int32 array; "fF" and "C" exist in the
# table but neither nnabla's writer nor the runtime's structs can encode them.
ARG_CODES: Mapping[str, str] = {
    "bool": "B",
    "float": "f",
    "double": "f",
    "int64": "i",
    "string": "i",
    "Shape": "iI",
    "repeated int64": "iI",
    "repeated float": "fF",
    "Communicator": "C",
}

# Functions with a kernel in sony/nnabla-c-runtime (an allocate_*_local_context outside
# src/functions/implements/unimplemented.c). doc/SUPPORT_STATUS.md also lists Einsum (63 in
# all), but the runtime has no Einsum kernel and no case for its id in function_context.c.
RUNTIME_IMPLEMENTED: frozenset[str] = frozenset(
    {
        "Abs", "Add2", "AddScalar", "Affine", "AveragePooling", "BatchMatmul",
        "BatchNormalization", "BinaryConnectAffine", "BinaryConnectConvolution",
        "BinarySigmoid", "BinaryTanh", "BinaryWeightAffine", "BinaryWeightConvolution", "CELU",
        "CReLU", "Concatenate", "Convolution", "Deconvolution", "DepthwiseConvolution", "Div2",
        "Dropout", "ELU", "Exp", "Flip", "Identity", "LeakyReLU", "Log", "MatrixDiag",
        "MatrixDiagPart", "MaxPooling", "Maximum2", "MaximumScalar", "MeanSubtraction",
        "Minimum2", "MinimumScalar", "Mul2", "MulScalar", "PReLU", "Pad", "Pow2", "PowScalar",
        "RDivScalar", "RPowScalar", "RSubScalar", "ReLU", "Reshape", "Round", "SELU", "Shift",
        "Sigmoid", "Sign", "Slice", "Softmax", "Split", "Stack", "Sub2", "Sum", "SumPooling",
        "Swish", "Tanh", "Transpose", "Unpooling",
    }
)  # fmt: skip

# Functions with dedicated int16/int8 kernels; every other implemented function computes in
# float through the type-generic getters/setters (docs/nnb-runtime-semantics.md).
RUNTIME_FIXED_POINT: frozenset[str] = frozenset(
    {
        "Affine", "Convolution", "DepthwiseConvolution", "MaxPooling", "AveragePooling",
        "SumPooling", "ReLU", "Reshape", "Transpose", "Add2", "Sub2", "Mul2", "Div2",
        "AddScalar", "MulScalar",
    }
)  # fmt: skip

# name -> ((argument name, nnabla type, allowed string values), ...)
Arguments = Mapping[str, tuple[tuple[str, str, tuple[str, ...]], ...]]
# API level -> {unique name "Convolution_iiIiIiIiB": function id} (only what the level adds)
ApiLevels = Mapping[int, Mapping[str, int]]


@attrs.frozen
class ArgSpec:
    """One encoded argument: its nnabla name and type and the pack code it takes in a struct."""

    name: str
    type: str
    code: str
    choices: tuple[str, ...] = ()


@attrs.frozen
class FunctionSpec:
    """A function as one API level encodes it: id, argument format and the arguments it keeps."""

    name: str
    id: int
    level: int  # the API level that introduced this id
    argfmt: str  # e.g. "iiIiIiIiB"; "" for no arguments
    args: tuple[ArgSpec, ...]  # one per token of argfmt, in order

    @property
    def runtime_implemented(self) -> bool:
        return self.name in RUNTIME_IMPLEMENTED


def tokenize_argfmt(argfmt: str) -> tuple[str, ...]:
    """Split an argument format into struct fields: "iiIB" -> ("i", "iI", "B")."""
    tokens: list[str] = []
    i = 0
    while i < len(argfmt):
        pair = argfmt[i : i + 2]
        if pair in ("iI", "fF"):
            tokens.append(pair)
            i += 2
        elif argfmt[i] in "ifBC":
            tokens.append(argfmt[i])
            i += 1
        else:
            raise ValueError(f"unknown argument code {argfmt[i]!r} in {argfmt!r}")
    return tuple(tokens)


@attrs.frozen(eq=False)
class FunctionTable:
    """nnabla's function ids and argument formats for every API level, resolved like nnabla."""

    api_levels: ApiLevels
    arguments: Arguments
    source: str  # where the table came from, for messages
    _by_level: dict[int, dict[str, FunctionSpec]] = attrs.field(
        factory=dict, init=False, repr=False
    )
    _by_id: dict[int, FunctionSpec] = attrs.field(factory=dict, init=False, repr=False)

    @property
    def max_level(self) -> int:
        return max(self.api_levels)

    def check_level(self, level: int) -> int:
        """The level itself if this table knows it; -1 means the newest, as in nnabla_cli."""
        if level == -1:
            return self.max_level
        if not 1 <= level <= self.max_level:
            raise UsageError(
                f"API level {level} is not known to {self.source} (levels 1..{self.max_level})"
            )
        return level

    def functions(self, level: int) -> Mapping[str, FunctionSpec]:
        """Function name -> spec at `level`: each name takes its newest id up to that level."""
        level = self.check_level(level)
        if level not in self._by_level:
            specs: dict[str, FunctionSpec] = {}
            for lvl in sorted(self.api_levels):
                if lvl > level:
                    break
                for uniq, fid in self.api_levels[lvl].items():
                    specs[uniq.split("_")[0]] = self._spec_for_id(fid)
            self._by_level[level] = specs
        return self._by_level[level]

    def spec(self, name: str, level: int) -> FunctionSpec:
        """The spec nnabla's writer would use for `name`; unsupported when it cannot encode it."""
        spec = self.functions(level).get(name)
        if spec is None:
            raise UnsupportedError(f"{name} is not available at NNabla API level {level}")
        full = self.arguments.get(name, ())
        if any(not a.name for a in spec.args) or len(spec.args) > len(full):
            # nnabla only down-versions by dropping trailing arguments.
            raise UnsupportedError(
                f"{name} cannot be encoded at NNabla API level {level} "
                f"(format {spec.argfmt!r} does not match its arguments)"
            )
        for arg in spec.args:
            if arg.code in ("fF", "C"):
                raise UnsupportedError(
                    f"{name} argument {arg.name!r} ({arg.type}) cannot be stored in .nnb"
                )
        return spec

    def by_id(self, type_id: int, level: int) -> FunctionSpec | None:
        """The spec of a function id valid in a file of `level` (superseded ids included)."""
        self._index_ids()
        spec = self._by_id.get(type_id)
        if spec is None or spec.level > level:
            return None
        return spec

    def _index_ids(self) -> None:
        if self._by_id:
            return
        for lvl in sorted(self.api_levels):
            for uniq, fid in self.api_levels[lvl].items():
                name, _, fmt = uniq.partition("_")
                self._by_id[fid] = FunctionSpec(
                    name, fid, lvl, "" if fmt == "Empty" else fmt, self._arg_specs(name, fmt)
                )

    def _spec_for_id(self, fid: int) -> FunctionSpec:
        self._index_ids()
        return self._by_id[fid]

    def _arg_specs(self, name: str, fmt: str) -> tuple[ArgSpec, ...]:
        """Name each token by the function's arguments, in order, while the codes agree."""
        tokens = tokenize_argfmt("" if fmt == "Empty" else fmt)
        full = self.arguments.get(name, ())
        specs: list[ArgSpec] = []
        named = True
        for k, token in enumerate(tokens):
            if named and k < len(full) and ARG_CODES.get(full[k][1]) == token:
                arg_name, arg_type, choices = full[k]
                specs.append(ArgSpec(arg_name, arg_type, token, choices))
            else:
                named = False  # an older layout: the rest keeps only its codes
                specs.append(ArgSpec("", "", token))
        return tuple(specs)


def normalize_levels(raw: Mapping[Any, Mapping[Any, Any]]) -> dict[int, dict[str, int]]:
    """nnabla's api_level_info as plain sorted dicts."""
    return {int(lvl): {str(u): int(i) for u, i in raw[lvl].items()} for lvl in sorted(raw)}


def normalize_arguments(info: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Function name -> argument (name, type, choices) tuples, from nnabla's function info."""
    out: dict[str, Any] = {}
    for name in sorted(info):
        args = info[name].get("arguments") or {}
        out[name] = tuple(
            (str(a), str(spec["type"]), tuple(str(v) for v in spec.get("available_values", ())))
            for a, spec in args.items()
        )
    return out


class _TableUnpickler(pickle.Unpickler):
    """functions.pkl holds only OrderedDicts and builtins; refuse anything else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in nnabla's functions.pkl")


def installed_table() -> FunctionTable | None:
    """The installed nnabla's table, read from its data file without importing nnabla."""
    try:
        spec = importlib.util.find_spec("nnabla")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "utils/converter/functions.pkl"
    try:
        with path.open("rb") as f:
            data = _TableUnpickler(f).load()
        flat = {n: fi for cat in data["nnabla_func_info"].values() for n, fi in cat.items()}
        levels = normalize_levels(data["api_level_info"])
        arguments = normalize_arguments(flat)
        version = importlib.metadata.version("nnabla")
    except (OSError, KeyError, TypeError, AttributeError, ValueError, pickle.UnpicklingError):
        return None
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if not levels:
        return None
    return FunctionTable(levels, arguments, f"nnabla {version} (installed)")


def committed_table() -> FunctionTable:
    """The table generated into _function_table.py."""
    from . import _function_table as t

    return FunctionTable(t.API_LEVELS, t.ARGUMENTS, f"nnabla {t.NNABLA_VERSION} (committed)")


@functools.lru_cache(maxsize=1)
def default_table() -> FunctionTable:
    """The installed nnabla's table when there is one, else the committed copy."""
    return installed_table() or committed_table()
