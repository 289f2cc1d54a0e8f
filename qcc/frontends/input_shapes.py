"""Input shapes from the user: one binding step every frontend runs before it builds anything.

Real models are shipped with dynamic input dims (ONNX `dim_param` symbols or -1, nnabla's -1
batch, torch.export's symbolic sizes); an embedded compiler needs static ones. The user gives
them with `--input-shape NAME=D0,D1,...` (repeatable; NAME may be omitted for a one-input model),
`input_shapes={"x": (1, 3, 224, 224)}` in the API, or the older `--batch-size N` (a symbolic
first dim of every input). `bind_inputs` turns the declared dims of all inputs into the shapes
the import uses, once, so the frontend's constant folding (Shape -> Gather -> Concat -> Reshape,
Range, Expand, ConstantOfShape) then sees static shapes. A symbol bound on one input is bound
wherever it appears (two inputs sharing a batch symbol get the same batch).

Dims still dynamic afterwards stay symbols; where an op needs a static one, the frontend asks
`BoundShapes.hint` for the sentence that names the input, the dim and the flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from qcc.errors import UsageError
from qcc.ir.types import Dim

FLAG = "--input-shape"
API = "input_shapes="

ShapeSpec = Mapping[str | None, Sequence[int]]
"""Input name (None: the model's only input) -> its full shape."""


def parse_input_shape(text: str) -> tuple[str | None, tuple[int, ...]]:
    """`NAME=D0,D1,...` or `D0,D1,...` -> (NAME or None, dims); a UsageError naming the text."""
    name, sep, dims_text = text.rpartition("=")
    dims_text = dims_text.strip().strip("[]()")
    try:
        dims = tuple(int(d) for d in dims_text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise UsageError(f"{FLAG} {text!r}: expected NAME=D0,D1,... with integer dims, e.g. x=1,3,224,224") from None
    if not dims or any(d < 1 for d in dims):
        raise UsageError(f"{FLAG} {text!r}: give every dim as an integer >= 1, e.g. x=1,3,224,224")
    if sep and not name.strip():
        raise UsageError(f"{FLAG} {text!r}: the name before '=' is empty (omit 'NAME=' for a one-input model)")
    return (name.strip() if sep else None), dims


def parse_input_shapes(texts: Iterable[str]) -> dict[str | None, tuple[int, ...]]:
    """Every `--input-shape` flag; naming one input twice is a usage error."""
    shapes: dict[str | None, tuple[int, ...]] = {}
    for text in texts:
        name, dims = parse_input_shape(text)
        if name in shapes:
            raise UsageError(f"{FLAG} given twice for {'the input' if name is None else repr(name)}")
        shapes[name] = dims
    return shapes


def normalize(spec: ShapeSpec | Sequence[int] | Sequence[str] | None) -> dict[str | None, tuple[int, ...]]:
    """The API's `input_shapes=`: a mapping, one shape (one-input model) or a list of flag texts."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        out: dict[str | None, tuple[int, ...]] = {}
        for name, dims in spec.items():
            try:
                shape = tuple(int(d) for d in dims)
            except (TypeError, ValueError):
                raise UsageError(f"{API} {name!r}: expected a sequence of integer dims, got {dims!r}") from None
            if not shape or any(d < 1 for d in shape):
                raise UsageError(f"{API} {name!r}: every dim must be an integer >= 1, got {list(dims)}")
            out[name or None] = shape
        return out
    items = list(spec)
    if items and all(isinstance(t, str) for t in items):
        return parse_input_shapes(items)  # type: ignore[arg-type]
    return normalize({None: items})  # type: ignore[dict-item]


@attrs.frozen
class BoundShapes:
    """The shapes an import uses, and where each remaining symbol came from."""

    shapes: dict[str, tuple[Dim, ...]]
    symbols: dict[str, int]
    origins: dict[str, tuple[str, int]]

    def dim(self, symbol: str, default: Dim | None = None) -> Dim | None:
        """A symbol's bound value (for frontends whose other tensors reuse an input's symbol)."""
        return self.symbols.get(symbol, default)

    def hint(self, shapes: Iterable[Sequence[Dim]], message: str = "") -> str:
        """'dim 2 of input 'x' is dynamic ...; bind it with --input-shape x=...' for the unbound
        symbol in `shapes` most likely at fault: one the error `message` quotes, else one that is
        not a first (batch) dim. Empty when every dim is static."""
        found = [d for shape in shapes for d in shape if isinstance(d, str) and d in self.origins]
        if not found:
            return ""
        quoted = [d for d in found if f"'{d}'" in message]
        inner = [d for d in found if self.origins[d][1] > 0]
        symbol = (quoted or inner or found)[0]
        name, index = self.origins[symbol]
        example = ",".join(str(x) if isinstance(x, int) else x.upper() for x in self.shapes[name])
        return (f"dim {index} of input {name!r} is dynamic ({symbol!r}); bind it with "
                f"{FLAG} {name}={example} ({API} in the API)")


def bind_inputs(declared: Mapping[str, Sequence[Dim]], spec: ShapeSpec | Sequence[int] | None = None,
                batch_size: int | None = None, source: str = "") -> BoundShapes:
    """Bind `declared` (input name -> dims, symbols as str) with the user's shapes and batch size.

    Explicit shapes come first: each must have the input's rank and agree with its static dims;
    their symbols are then bound everywhere. `batch_size` binds a first dim still symbolic.
    A name that is not an input, a None key on a model with several inputs, a wrong rank, a
    static dim contradicted or an input with no dynamic dim at all (the flag would change nothing)
    is a UsageError naming the input and listing the inputs.
    """
    given = normalize(spec)
    where = f"{source}: " if source else ""
    names = list(declared)
    if None in given:
        if len(names) != 1:
            raise UsageError(f"{where}{FLAG} without a name needs a one-input model; this one has inputs "
                             f"{names}: write NAME=D0,D1,...")
        if names[0] in given:
            raise UsageError(f"{where}{FLAG} given twice for input {names[0]!r}")
        given[names[0]] = given.pop(None)
    unknown = [n for n in given if n not in declared]
    if unknown:
        raise UsageError(f"{where}{FLAG} names {unknown[0]!r}, which is not an input of the model (inputs: {names})")
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"{where}batch size must be >= 1, got {batch_size}")
    symbols: dict[str, int] = {}
    for name, dims in given.items():
        assert name is not None
        _bind_explicit(name, list(declared[name]), dims, symbols, where)
    if batch_size is not None:
        for name in names:
            first = declared[name][0] if declared[name] else None
            if isinstance(first, str) and name not in given:
                _bind_symbol(first, batch_size, name, 0, symbols, where, "--batch-size")
            elif isinstance(first, int) and first != batch_size:  # issue 16: a flag takes effect or fails
                raise UsageError(f"{where}--batch-size {batch_size}: input {name!r} has a static batch of {first} "
                                 f"(declared {_text(list(declared[name]))}); the model cannot run other batches")
    shapes: dict[str, tuple[Dim, ...]] = {}
    origins: dict[str, tuple[str, int]] = {}
    for name in names:
        bound_dims: tuple[Dim, ...] = tuple(symbols[d] if isinstance(d, str) and d in symbols else d
                                      for d in declared[name])
        shapes[name] = bound_dims
        for i, d in enumerate(bound_dims):
            if isinstance(d, str):
                origins.setdefault(d, (name, i))
    return BoundShapes(shapes, symbols, origins)


def _bind_explicit(name: str, dims: list[Dim], shape: tuple[int, ...], symbols: dict[str, int], where: str) -> None:
    if len(shape) != len(dims):
        raise UsageError(f"{where}{FLAG} {name}={','.join(map(str, shape))}: input {name!r} has rank {len(dims)} "
                         f"(declared {_text(dims)})")
    for i, (d, want) in enumerate(zip(dims, shape)):
        if isinstance(d, int) and d != want:
            raise UsageError(f"{where}{FLAG} {name}={','.join(map(str, shape))}: dim {i} of input {name!r} is "
                             f"static {d} (declared {_text(dims)})")
        if isinstance(d, str):
            _bind_symbol(d, want, name, i, symbols, where, FLAG)
    if not any(isinstance(d, str) for d in dims):  # the flag would change nothing: issue 16's rule
        raise UsageError(f"{where}{FLAG} {name}={','.join(map(str, shape))}: input {name!r} has no dynamic dim "
                         f"(declared {_text(dims)}), so there is nothing to bind; drop the flag for it")


def _bind_symbol(symbol: str, value: int, name: str, index: int, symbols: dict[str, int], where: str,
                 flag: str) -> None:
    if symbols.get(symbol, value) != value:
        raise UsageError(f"{where}{flag}: dim {index} of input {name!r} is the symbol {symbol!r}, already bound to "
                         f"{symbols[symbol]}; it cannot also be {value}")
    symbols[symbol] = value


def _text(dims: Sequence[Any]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
