"""IR -> kernel calls for target c: the lowering walk, the numeric-mode protocol, C arrays.

Everything a model needs is checked here, before any file is written: an op, an annotation or
an operand kind the C target cannot compute raises UnsupportedError naming the node. What differs
between float, fixed point and affine int8/uint8 is a `NumericMode` object (`qcc.backends.c.modes`):
this module only walks the graph, names things and formats arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import attrs
import numpy as np
from qcc.backends.c.ctype import INDEX, CType, comment_text
from qcc.backends.c.kernels.helpers import KernelSet

from qcc.errors import UnsupportedError
from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import all_ops, op_has

MAX_RANK = 6
UNPACKED = "QCC_UNPACKED"
"""The macro naming the arena's tail that holds one layer's unpacked 4-bit weights."""


@attrs.frozen
class Ptr:
    """A tensor's data pointer, resolved once the arena plan is known."""

    value: Value
    plus: int = 0
    """Elements past the tensor's start (a slice of channels: fixed4's packed layers)."""


Arg = str | Ptr


@attrs.frozen
class Call:
    fn: str
    args: tuple[Arg, ...]


@attrs.define
class Step:
    node: Node
    calls: list[Call] = attrs.field(factory=list)
    alias: bool = False
    inplace: tuple[int, ...] = ()
    """Inputs whose storage the output may take over when they die here (kernel reads before writes)."""
    fused: bool = False
    """An alias whose values the producer's kernel already computed (its epilogue)."""


@attrs.frozen
class ConstArray:
    name: str
    ctype: CType
    data: np.ndarray
    comment: str


def static_shape(value: Value) -> tuple[int, ...]:
    """Symbolic dims (the batch) are bound to 1: the generated code runs one sample per call."""
    return tuple(d if isinstance(d, int) else 1 for d in value.type.shape)


def numel(value: Value) -> int:
    return int(np.prod(static_shape(value), dtype=np.int64))


def c_identifier(text: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)
    return out if out and not out[0].isdigit() else f"_{out}"


def activations(model: Model) -> list[Value]:
    """Graph inputs and node outputs: what the numeric mode is decided on (element indices, the
    int64 outputs of ArgMax and TopK, are stored as int32 in every mode and decide nothing)."""
    graph = model.graph
    return [v for v in (*graph.inputs, *(v for n in graph.nodes for v in n.outputs)) if not is_index(v)]


def is_index(value: Value) -> bool:
    return value.type.dtype == "int64" and value.const is None and value.producer() is not None


def where(value: Value) -> str:
    node = value.producer()
    return f" (output of node {node.name!r}, {node.op})" if node is not None else ""


LowerFn = Callable[["Lowering", Node], Step]


class NumericMode:
    """One numeric mode of target c: the protocol the lowering and the emitter ask.

    A mode says which models it is (`claims`, `check`), how tensors and parameters are stored
    (`ctype`, `param`), which ops it lowers and how (`lowerings`, plus views and whatever
    `derived_lowering` finds in the registry), what it refuses and why (`refusal`), the kernel
    arguments its element conversions need (`scales`, `copy_args`) and how the graph's float
    inputs and outputs enter and leave it (`transfer`, `tensor_macros`).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    """The header's "Numeric mode:" line."""
    integer: ClassVar[bool]
    """Activations are integers: inputs quantized, outputs dequantized, FLT_EVAL_METHOD checked."""
    lowerings: ClassVar[Mapping[str, LowerFn]]

    def claims(self, acts: Sequence[Value]) -> bool:
        """The model is meant for this mode (then `check` must accept all of it)."""
        raise NotImplementedError

    def check(self, acts: Sequence[Value]) -> None:
        """Raise UnsupportedError naming the first activation this mode cannot store."""
        raise NotImplementedError

    def ctype(self, value: Value) -> CType:
        raise NotImplementedError

    def param(self, lw: Lowering, value: Value, node: Node) -> tuple[CType, np.ndarray, str]:
        """A constant operand as stored: element type, data, comment (or UnsupportedError)."""
        raise NotImplementedError

    def scales(self, x: Value, y: Value) -> list[str]:
        """The arguments of `ctype.scale_params(x, y)`: what the getter of x and the setter of y read."""
        raise NotImplementedError

    def copy_args(self, lw: Lowering, node: Node, x: Value, y: Value) -> list[str]:
        """The arguments of `kernels.movement.convert`: moving one element from x's type to y's."""
        raise NotImplementedError

    def transfer(self, ks: KernelSet, value: Value, inbound: bool) -> tuple[str, list[str]] | None:
        """The kernel (and its scaling arguments) quantizing a graph input into the arena or
        dequantizing an output out of it; None: a plain float copy."""
        raise NotImplementedError

    def tensor_macros(self, key: str, value: Value) -> list[str]:
        """The header's `<key>_TYPE` line and whatever describes the stored type."""
        raise NotImplementedError

    def view(self, lw: Lowering, node: Node) -> Step:
        """The lowering of views and Quantize (any op with the registry's `view` or `quantize` trait)."""
        raise NotImplementedError

    def derived_lowering(self, op: str) -> LowerFn | None:
        """A lowering found from the op's registry traits, for ops `lowerings` does not name."""
        return None

    def refusal(self, op: str) -> str:
        """Why `op` is not lowered ("" when there is nothing more to say than "not supported")."""
        return ""

    def lowering(self, op: str) -> LowerFn | None:
        if op in self.lowerings:
            return self.lowerings[op]
        if op_has(op, "view") or op_has(op, "quantize"):
            return self.view
        return self.derived_lowering(op)

    def lowered_ops(self) -> frozenset[str]:
        """Every registered op this mode lowers (support tables read this)."""
        return frozenset(op for op in all_ops() if self.lowering(op) is not None)

    def float_ops(self) -> frozenset[str]:
        """Ops this mode computes in float32 between its stored tensors (the rest: integer kernels,
        tables and copies). Only meaningful for the integer modes."""
        return frozenset()

    def computes_in_float(self, node: Node) -> bool:
        """The node is a float island: an integer mode computes it in float32 between its stored
        tensors (the compile report lists each one)."""
        return self.integer and node.op in self.float_ops()


class Lowering:
    """Walks the graph once; collects kernels, constant arrays, parameter structs and steps."""

    def __init__(self, model: Model, mode: NumericMode, dot8: bool = False, pack4: bool = True,
                 unpack_limit: int = 2048) -> None:
        self.model = model
        self.mode = mode
        self.dot8 = dot8
        """Affine dot products as uint8 x int8 (target option isa=dot8) rather than int16 x int16."""
        self.pack4 = pack4
        """4-bit weights two a byte, unpacked into the arena's tail before their layer (option weights4)."""
        self.unpack_limit = unpack_limit
        """Most weights unpacked at once: a larger layer runs in slices of output channels."""
        self.unpack_bytes = 0
        """Size of that tail: the largest slice's weights as int8."""
        self.weights4: list[tuple[int, int]] = []
        """(4-bit weights, bytes stored) per layer: the report line."""
        self.kernels = KernelSet()
        self.consts: dict[int, ConstArray] = {}
        self.defs: list[str] = []
        self._names: set[str] = set()
        self.fused: set[int] = set()
        self.steps = [self._lower(node) for node in model.graph.nodes]

    # ------------------------------------------------------------ helpers
    def ctype(self, value: Value) -> CType:
        return INDEX if is_index(value) else self.mode.ctype(value)

    def unique(self, base: str) -> str:
        name = c_identifier(base)
        candidate, k = name, 1
        while candidate in self._names:
            candidate, k = f"{name}_{k}", k + 1
        self._names.add(candidate)
        return candidate

    def array(self, data: np.ndarray, ctype: CType, base: str, comment: str) -> str:
        arr = ConstArray(self.unique(base), ctype, np.ascontiguousarray(data).reshape(-1), comment)
        self.defs.append(format_array(arr))
        return arr.name

    def const(self, value: Value, node: Node) -> str:
        """The C array of a constant operand (float32, or the integers the simulator stores)."""
        if value.const is None:
            raise UnsupportedError(f"target c: node {node.name!r} ({node.op}) needs input {value.name!r} "
                                   "to be a constant")
        if id(value) not in self.consts:
            ctype, data, comment = self.mode.param(self, value, node)
            arr = ConstArray(self.unique(f"qcc_c_{value.name}"), ctype, np.asarray(data).reshape(-1), comment)
            self.consts[id(value)] = arr
            self.defs.append(format_array(arr))
        return self.consts[id(value)].name

    def unpacked(self, count: int) -> str:
        """Where `count` unpacked 4-bit weights go: the arena's tail (`UNPACKED`, defined by the emitter)."""
        self.unpack_bytes = max(self.unpack_bytes, count)
        return UNPACKED

    def operand(self, value: Value, node: Node) -> Arg:
        return self.const(value, node) if value.const is not None else Ptr(value)

    def struct(self, ctype: str, base: str, fields: Sequence[int | Sequence[int]]) -> str:
        """A static const parameter struct; a list field is an array member."""
        name = self.unique(base)
        text = ", ".join(str(int(f)) if isinstance(f, (int, np.integer)) else "{" + ", ".join(map(str, f)) + "}"
                         for f in fields)
        self.defs.append(f"static const {ctype} {name} = {{{text}}};\n")
        return f"&{name}"

    def consumer(self, value: Value) -> Node | None:
        """The one node reading `value`, as its first input, when nothing else does (not even the
        graph's outputs): a producer may then compute it in its epilogue (`fuse`)."""
        uses = value.uses()
        if len(uses) != 1 or uses[0][1] != 0 or any(v is value for v in self.model.graph.outputs):
            return None
        node = uses[0][0]
        return node if len(node.outputs) == 1 else None

    def fuse(self, node: Node) -> None:
        """`node` is computed by its producer's kernel: its step becomes an alias of its input."""
        self.fused.add(id(node))

    def unsupported(self, node: Node, why: str = "") -> UnsupportedError:
        extra = f": {why}" if why else ""
        return UnsupportedError(f"target c: op {node.op} (node {node.name!r}) is not supported in {self.mode.name} "
                                f"mode{extra}")

    def scales(self, x: Value, y: Value) -> list[str]:
        return self.mode.scales(x, y)

    # ------------------------------------------------------------ dispatch
    def _lower(self, node: Node) -> Step:
        if id(node) in self.fused:
            return Step(node, alias=True, fused=True)
        fn = self.mode.lowering(node.op)
        if fn is None:
            raise self.unsupported(node, self.mode.refusal(node.op))
        try:
            return fn(self, node)
        except UnsupportedError as exc:
            text = str(exc)
            raise UnsupportedError(text if text.startswith("target c") else f"target c: {text}") from None


def format_array(arr: ConstArray) -> str:
    """The C definition of a constant array, 100-column lines.

    Formatted a chunk at a time: one Python float and one string per element of a 100M-element
    weight took 15 GB (vgg19's 575 MB of weights needed 17.5 GB to compile to C).
    """
    data = arr.data
    if not arr.ctype.is_int:
        data = data.astype(np.float32)
        if not np.isfinite(data).all():
            raise UnsupportedError(f"target c: constant {arr.comment.split(':')[0]!r} contains NaN or Inf")
    lines: list[str] = []
    pending = ""
    for start in range(0, len(data), _CHUNK):
        chunk = data[start:start + _CHUNK]
        if arr.ctype.is_int:
            texts = list(map(str, chunk.astype(np.int64).tolist()))
        else:
            texts = [t + "f" if "." in t or "e" in t else t + ".f" for t in (f"{v:.9g}" for v in chunk.tolist())]
        pending = (pending + "," if pending else "") + ",".join(texts)
        pending = _wrap_lines(pending, lines, final=start + _CHUNK >= len(data))
    body = "\n".join(lines) if lines else "0"
    return f"/* {comment_text(arr.comment)} */\nstatic const {arr.ctype.name} {arr.name}[{max(len(data), 1)}] = {{\n{body}\n}};\n"


_CHUNK = 1 << 16


def _wrap_lines(body: str, lines: list[str], final: bool, width: int = 100) -> str:
    """Move the complete lines of `body` into `lines` (each cut after its last comma within `width`,
    or at the first comma past it); the rest, unless `final`, waits for the next chunk."""
    start = 0
    while start < len(body):
        end = start + width
        if end >= len(body):
            if not final:
                break
            end = len(body)
        else:
            cut = body.rfind(",", start, end)
            if cut > start:
                end = cut + 1
            else:
                after = body.find(",", end)
                if after < 0 and not final:
                    break
                end = after + 1 if after >= 0 else len(body)
        lines.append(body[start:end])
        start = end
    return body[start:]

