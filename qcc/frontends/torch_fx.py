"""The FX graph of a torch.export program -> qcc IR: scan, call-site names, constants, the loop.

Every call site is its own IR node: a call of a leaf module is named by its module path (the
k-th call of a reused module gets `_k`), an op called directly in a container's forward
(`out += identity`, `torch.cat`, `F.sigmoid`) is named `<container path>.<op>`. Nodes computed
from parameters and buffers alone are evaluated with torch at import (weight transposes,
`zeros` for LSTM states...), so the IR only holds computation on the inputs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from qcc.errors import InternalError, InvalidInputError, UnsupportedError, UsageError
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.types import Dim, TensorType
from qcc.ir.verify import verify_model
from qcc.tables import Emits, check_emitted, importer_registrar

Converter = Callable[["TorchCtx", dict[str, Any]], Any]
CONVERTERS: dict[str, Converter] = {}
"""ATen op ("aten.<name>.<overload>" or "operator.<fn>") -> function building its IR."""
EMITS: dict[str, frozenset[str]] = {}
"""ATen op -> the IR ops its converter may create (checked on every import)."""
KEEP_WHOLE: set[str] = set()
"""ATen ops `run_decompositions` must leave whole: their converter maps them better than their parts."""
_register = importer_registrar(CONVERTERS, EMITS)

IGNORED_PREFIXES = ("aten._assert", "aten.sym_constrain_range")
# ops that move or reinterpret data: never the node that names a call site if another op exists
LAYOUT_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "flatten", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "contiguous", "clone", "alias",
    "detach", "expand", "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "sym_size",
    "narrow", "_to_copy", "to", "lift_fresh_copy",
})
# ops whose result may share storage with their first argument (for the in-place safety check)
ALIASING_OPS = LAYOUT_OPS - {"clone", "_to_copy", "lift_fresh_copy", "sym_size"} | {"as_strided", "type_as"}
PRETTY = {"_native_batch_norm_legit_no_training": "batch_norm", "native_batch_norm": "batch_norm",
          "convolution": "conv", "conv2d": "conv", "max_pool2d_with_indices": "max_pool2d", "addmm": "linear",
          "_softmax": "softmax", "_log_softmax": "log_softmax", "_unsafe_view": "view",
          "_adaptive_avg_pool2d": "adaptive_avg_pool2d", "split_with_sizes": "split"}


def converts(*keys: str, emits: Emits, keep_whole: bool = False) -> Callable[[Converter], Converter]:
    """Register a converter for `keys`, the IR ops it may create, and whether decompositions
    must keep these ops whole."""
    if keep_whole:
        KEEP_WHOLE.update(keys)
    return _register(*keys, emits=emits)  # type: ignore[no-any-return]


def _load_converters() -> None:
    for module in ("qcc.frontends.torch_aten", "qcc.frontends.torch_lstm", "qcc.frontends.torch_layers"):
        importlib.import_module(module)


def op_key(target: Any) -> str:
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return f"operator.{getattr(target, '__name__', target)}"
    return str(target)


def op_base(target: Any) -> str:
    """'add' for aten.add_.Tensor, 'getitem' for operator.getitem."""
    name = getattr(target, "_opname", None) or getattr(target, "__name__", None) or str(target)
    return str(name).rstrip("_") or str(name)


def is_inplace(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable and op_base(target) != getattr(target, "_opname", ""))


# ----------------------------------------------------------------------------- scan
@attrs.frozen
class Scan:
    """What an FX graph needs before import: unmapped ops (op -> module paths), unsafe in-place ops."""

    unsupported: dict[str, list[str]]
    unsafe_mutations: list[str]
    foldable: frozenset[str]


def module_path(node: Any) -> tuple[str, int, bool]:
    """(innermost module path, call index, whether the stack is empty) from nn_module_stack."""
    stack = list((node.meta.get("nn_module_stack") or {}).items())
    if not stack:
        return "", 0, True
    key, (path, _) = stack[-1]
    head, _, tail = str(key).rpartition("@")
    call = int(tail) if head and tail.isdigit() else 0
    return str(path), call, False


def scan_program(program: Any) -> Scan:
    _load_converters()
    nodes = list(program.graph.nodes)
    kinds = {spec.arg.name: spec.kind.name for spec in program.graph_signature.input_specs
             if hasattr(spec.arg, "name")}
    dynamic: set[str] = set()
    foldable: set[str] = set()
    unsupported: dict[str, list[str]] = {}
    for node in nodes:
        if node.op == "placeholder":
            kind = kinds.get(node.name, "USER_INPUT")
            if kind == "USER_INPUT":
                dynamic.add(node.name)
            elif kind not in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                unsupported.setdefault(f"input of kind {kind}", []).append(node.name)
            continue
        if node.op == "output":
            continue
        if any(arg.name in dynamic for arg in node.all_input_nodes):
            dynamic.add(node.name)
        if node.op != "call_function":
            unsupported.setdefault(f"{node.op} {node.target}", []).append(module_path(node)[0])
            continue
        key = op_key(node.target)
        if node.name not in dynamic:
            foldable.add(node.name)
        elif key not in CONVERTERS and key != "operator.getitem" and not key.startswith(IGNORED_PREFIXES):
            unsupported.setdefault(key, []).append(module_path(node)[0])
    return Scan(unsupported, _unsafe_mutations(nodes), frozenset(foldable))


def _unsafe_mutations(nodes: list[Any]) -> list[str]:
    """In-place ops whose effect an older alias of the mutated tensor would observe afterwards."""
    order = {node.name: i for i, node in enumerate(nodes)}
    root: dict[str, str] = {}
    for node in nodes:
        base = op_base(node.target) if node.op == "call_function" else ""
        first = node.args[0] if node.args and hasattr(node.args[0], "name") else None
        aliasing = base in ALIASING_OPS or is_inplace(node.target) or (
            base == "getitem" and first is not None and op_base(first.target) in ALIASING_OPS)
        root[node.name] = root.get(first.name, first.name) if aliasing and first is not None else node.name
    groups: dict[str, list[Any]] = {}
    for node in nodes:
        groups.setdefault(root[node.name], []).append(node)
    unsafe = []
    for node in nodes:
        if node.op != "call_function" or not is_inplace(node.target) or not node.args:
            continue
        target = node.args[0]
        group = [n for n in groups[root[target.name]] if n.name not in (target.name, node.name)]
        here = order[node.name]
        for member in group:
            if order[member.name] < here and any(order[user.name] > here for user in member.users):
                unsafe.append(node.name)
                break
    return unsafe


def describe_unsupported(scan: Scan, source: str) -> str:
    parts = []
    for op, paths in sorted(scan.unsupported.items()):
        shown = sorted({p or "<top>" for p in paths})
        where = ", ".join(repr(p) for p in shown[:5]) + (f" (+{len(shown) - 5} more)" if len(shown) > 5 else "")
        parts.append(f"{op} x{len(paths)} at {where}")
    return (f"{source}: unsupported ATen op(s): {'; '.join(parts)} "
            f"(see docs/frontend-torch.md for the ops qcc maps)")


# ----------------------------------------------------------------------------- call sites
@attrs.frozen
class Site:
    name: str
    primary: bool


def plan_sites(nodes: list[Any], foldable: frozenset[str]) -> dict[str, Site]:
    """Name every call site and pick the FX node whose main IR node carries the site's name."""
    compute = [n for n in nodes if n.op == "call_function" and n.name not in foldable
               and op_key(n.target) != "operator.getitem" and not op_key(n.target).startswith(IGNORED_PREFIXES)]
    containers: set[str] = set()
    for node in compute:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        containers.update(str(path) for path, _ in stack[:-1])
    leaf_of: dict[str, tuple[str, int]] = {}
    functional: dict[str, str] = {}
    for node in compute:
        path, call, _ = module_path(node)
        if path and path not in containers:
            leaf_of[node.name] = (path, call)
        else:
            pretty = PRETTY.get(op_base(node.target), op_base(node.target).lstrip("_"))
            functional[node.name] = f"{path}.{pretty}" if path else pretty
    taken: set[str] = set()
    names: dict[tuple[str, int], str] = {}
    for key in sorted(set(leaf_of.values()), key=lambda k: k[1] > 0):  # first calls claim plain paths
        names[key] = unique_name(key[0] if key[1] == 0 else f"{key[0]}_{key[1]}", taken)
    site_of: dict[str, str] = {}
    for node in compute:
        if node.name in leaf_of:
            site_of[node.name] = names[leaf_of[node.name]]
        else:
            site_of[node.name] = unique_name(functional[node.name], taken)
    last: dict[str, tuple[str, bool]] = {}
    for node in compute:  # the last non-layout node of a site names it (else its last node)
        site, layout = site_of[node.name], op_base(node.target) in LAYOUT_OPS
        if not layout or site not in last or last[site][1]:
            last[site] = (node.name, layout)
    return {n.name: Site(site_of[n.name], last[site_of[n.name]][0] == n.name) for n in compute}


def unique_name(base: str, taken: set[str], counters: dict[str, int] | None = None) -> str:
    counters = {} if counters is None else counters
    name, k = base, counters.get(base, 0)
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    counters[base] = k
    taken.add(name)
    return name


# ----------------------------------------------------------------------------- context
class TorchCtx:
    """Import state handed to converters: IR building with call-site names, constants, shapes."""

    def __init__(self, torch: Any, graph: Graph, source: str, sites: dict[str, Site]) -> None:
        self.torch = torch
        self.graph = graph
        self.source = source
        self.sites = sites
        self.taken: set[str] = {s.name for s in sites.values()}
        self.counters: dict[str, int] = {}
        self.const_names: dict[int, str] = {}
        self._const_values: dict[Any, tuple[Any, Value]] = {}
        self.site = Site("", False)
        self.op = ""
        self._created: list[Node] = []
        self._main: Node | None = None

    # -------------------------------------------------------------- errors
    @property
    def where(self) -> str:
        return f"{self.source}: {self.site.name or '<top>'} ({self.op})"

    def fail(self, why: str) -> UnsupportedError:
        return UnsupportedError(f"{self.where}: {why}")

    # -------------------------------------------------------------- values
    def is_const(self, arg: Any) -> bool:
        return isinstance(arg, (self.torch.Tensor, int, float, bool, np.ndarray)) and not isinstance(arg, Value)

    def array(self, arg: Any) -> np.ndarray:
        """A constant operand as numpy (float tensors as float32)."""
        if isinstance(arg, self.torch.Tensor):
            data = arg.detach().cpu()
            if data.is_floating_point():
                data = data.float()
            return np.array(data.numpy(), copy=True)
        if isinstance(arg, (int, float, bool, np.ndarray, np.generic)):
            return np.asarray(arg, dtype=np.float32)
        raise self.fail(f"needs a constant operand, got {type(arg).__name__}")

    def value(self, arg: Any, part: str = "const") -> Value:
        """An operand as an IR value (constants become float32 IR constants, once per tensor)."""
        if isinstance(arg, Value):
            return arg
        if isinstance(arg, self.torch.Tensor):
            cached = self._const_values.get(id(arg))
            if cached is None:
                name = self.const_names.get(id(arg)) or f"{self.site.name or 'const'}.{part}"
                cached = (arg, self.constant(self.array(arg), name))
                self._const_values[id(arg)] = cached
            return cached[1]
        if isinstance(arg, (int, float, bool, np.ndarray, np.generic)):
            return self.constant(np.asarray(arg, dtype=np.float32), f"{self.site.name or 'const'}.{part}")
        raise self.fail(f"operand of type {type(arg).__name__} is not a tensor")

    def weight_t(self, arg: Any) -> Value:
        """A constant 2-D weight transposed (torch (M, K) -> Dense (K, M)), once per tensor."""
        key = ("T", id(arg))
        if key not in self._const_values:
            name = f"{self.const_names.get(id(arg)) or self.site.name + '.weight'}_t"
            self._const_values[key] = (arg, self.constant(np.ascontiguousarray(self.array(arg).T), name))
        return self._const_values[key][1]

    def constant(self, data: np.ndarray, name: str) -> Value:
        data = np.ascontiguousarray(data.astype(np.float32, copy=False))
        return self.graph.add_constant(self.graph.unique_name(name), data)

    def const_name(self, arg: Any) -> str | None:
        return self.const_names.get(id(arg)) if isinstance(arg, self.torch.Tensor) else None

    @staticmethod
    def shape(value: Value) -> tuple[Dim, ...]:
        return tuple(value.type.shape)

    def static_shape(self, value: Value) -> tuple[int, ...]:
        if not value.type.is_static:
            raise self.fail(f"needs the static shape of {value.name!r}, got {value.type.shape}")
        return tuple(int(d) for d in value.type.shape)

    # -------------------------------------------------------------- building
    def emit(self, op: str, *inputs: Value | None, part: str | None = None, main: bool = False,
             **attributes: Any) -> Value:
        return self.emit_node(op, list(inputs), attributes, part=part, main=main).outputs[0]

    def emit_node(self, op: str, inputs: Sequence[Value | None], attributes: dict[str, Any],
                  part: str | None = None, main: bool = False) -> Node:
        base = f"{self.site.name}.{part or op.lower()}" if self.site.name else (part or op.lower())
        name = unique_name(base, self.taken, self.counters)
        try:
            node = self.graph.add_node(op, list(inputs), attributes, name=name)
        except InvalidInputError as exc:
            raise self.fail(str(exc)) from None
        self._created.append(node)
        if main:
            self._main = node
        return node

    def split(self, x: Value, axis: int, sizes: list[int], part: str) -> list[Value]:
        return list(self.emit_node("Split", [x], {"axis": axis, "split": sizes}, part=part).outputs)

    def begin(self, site: Site, op: str) -> None:
        self.site, self.op = site, op
        self._created, self._main = [], None

    def finish(self, result: Any) -> None:
        """Give the site's name to the main node the primary FX node of the site created."""
        if not self.site.primary:
            return
        main = self._main
        first = next((r for r in result if isinstance(r, Value)), None) if isinstance(result, (tuple, list)) \
            else result
        if main is None and isinstance(first, Value):
            producer = first.producer()
            main = producer if any(producer is n for n in self._created) else None
        if main is not None:
            rename_node(self.graph, main, self.site.name)


def rename_node(graph: Graph, node: Node, new: str) -> None:
    old = node.name
    graph._node_names.discard(old)
    node.name = new
    graph._node_names.add(new)
    for i, value in enumerate(node.outputs):
        wanted = new if len(node.outputs) == 1 else f"{new}_out{i}"
        if value.name in (old, f"{old}_out{i}") and wanted not in graph._names:
            rename_value(graph, value, wanted)


def rename_value(graph: Graph, value: Value, new: str) -> None:
    graph._names.discard(value.name)
    value.name = new
    graph._names.add(new)


# ----------------------------------------------------------------------------- the import loop
def bind_args(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments by schema name, defaults filled (operator.* targets: a0, a1...)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return {f"a{i}": a for i, a in enumerate(args)} | dict(kwargs)
    bound: dict[str, Any] = {}
    for i, spec in enumerate(schema.arguments):
        if i < len(args) and not spec.kwarg_only:
            bound[spec.name] = args[i]
        elif spec.name in kwargs:
            bound[spec.name] = kwargs[spec.name]
        else:
            bound[spec.name] = spec.default_value if spec.has_default_value() else None
    return bound


def build_model(torch: Any, program: Any, source: str, graph_name: str, input_names: Sequence[str] | None,
                batch_size: int | None) -> Model:
    _load_converters()
    map_arg = torch.fx.node.map_arg
    scan = scan_program(program)
    nodes = list(program.graph.nodes)
    graph = Graph(name=graph_name)
    ctx = TorchCtx(torch, graph, source, plan_sites(nodes, scan.foldable))
    env: dict[str, Any] = {}
    _bind_placeholders(ctx, program, nodes, env, input_names, batch_size)
    outputs: list[Any] = []
    for node in nodes:
        if node.op == "output":
            outputs = list(node.args[0]) if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            continue
        if node.op != "call_function":
            continue
        key = op_key(node.target)
        if key.startswith(IGNORED_PREFIXES):
            continue
        args = map_arg(node.args, lambda n: env[n.name])
        kwargs = map_arg(node.kwargs, lambda n: env[n.name])
        if key == "operator.getitem":
            env[node.name] = args[0][args[1]]
        elif node.name in scan.foldable:
            env[node.name] = _fold(ctx, node, args, kwargs)
        else:
            ctx.begin(ctx.sites[node.name], key)
            before = len(graph.nodes)
            result = CONVERTERS[key](ctx, bind_args(node.target, args, kwargs))
            check_emitted(EMITS, key, (n.op for n in graph.nodes[before:]), ctx.where)
            ctx.finish(result)
            env[node.name] = result
            if is_inplace(node.target) and node.args and hasattr(node.args[0], "name"):
                env[node.args[0].name] = result  # later readers of the mutated tensor see the result
    _bind_outputs(ctx, program, outputs, env)
    graph.cleanup()
    model = Model(graph, metadata={"source": source, "source_format": "torch"})
    problems = verify_model(model)
    if problems:
        raise InternalError(f"{source}: the imported graph is invalid: " + "; ".join(problems[:10]))
    return model


def _fold(ctx: TorchCtx, node: Any, args: Any, kwargs: Any) -> Any:
    torch = ctx.torch
    try:
        with torch.no_grad():
            result = node.target(*args, **kwargs)
    except Exception as exc:
        raise UnsupportedError(f"{ctx.source}: cannot evaluate constant node {node.name!r} ({op_key(node.target)}): "
                               f"{type(exc).__name__}: {str(exc)[:200]}") from None
    first = args[0] if args else None
    src = ctx.const_names.get(id(first)) if isinstance(first, torch.Tensor) else None
    base = op_base(node.target)
    if isinstance(result, torch.Tensor):
        if src and base in ("t", "permute", "transpose"):
            ctx.const_names[id(result)] = f"{src}_t"
        elif src and base in LAYOUT_OPS:
            ctx.const_names[id(result)] = src
        else:
            path, _, _ = module_path(node)
            ctx.const_names[id(result)] = f"{path}.{base}" if path else base
    return result


def _bind_placeholders(ctx: TorchCtx, program: Any, nodes: list[Any], env: dict[str, Any],
                       input_names: Sequence[str] | None, batch_size: int | None) -> None:
    torch = ctx.torch
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs if hasattr(spec.arg, "name")}
    user = [n for n in nodes if n.op == "placeholder" and specs[n.name].kind.name == "USER_INPUT"
            and isinstance(n.meta.get("val"), torch.Tensor)]  # other inputs were specialized by export
    names = list(input_names) if input_names is not None else [n.name for n in user]
    if len(names) != len(user) or len(set(names)) != len(names):
        raise UsageError(f"{ctx.source}: input_names {names} must be {len(user)} distinct names "
                         f"(the program's inputs: {[n.name for n in user]})")
    ctx.graph._names.update(names)
    for node in nodes:
        if node.op != "placeholder":
            continue
        spec = specs[node.name]
        if spec.kind.name == "USER_INPUT":
            env[node.name] = ctx.graph.add_input(names[user.index(node)], _input_type(ctx, node, batch_size)) \
                if node in user else node.meta.get("val")
            continue
        target = spec.target
        tensor = program.state_dict.get(target) if target in program.state_dict else program.constants.get(target)
        if not isinstance(tensor, torch.Tensor):
            raise UnsupportedError(f"{ctx.source}: input {node.name!r} ({spec.kind.name} {target}) is not a tensor")
        tensor = tensor.detach().clone()  # folding may run in-place ops: never touch the caller's module
        ctx.const_names[id(tensor)] = str(target)
        env[node.name] = tensor


def _input_type(ctx: TorchCtx, node: Any, batch_size: int | None) -> TensorType:
    val = node.meta.get("val")
    if not val.is_floating_point():
        raise UnsupportedError(f"{ctx.source}: input {node.name!r} has dtype {val.dtype}; only float inputs are supported")
    dims: list[Dim] = []
    for i, dim in enumerate(val.shape):
        if isinstance(dim, int):
            dims.append(int(dim))
        elif i == 0:
            dims.append(batch_size if batch_size is not None else "N")
        else:
            dims.append(str(dim))
    return TensorType("float32", tuple(dims))


def _bind_outputs(ctx: TorchCtx, program: Any, outputs: list[Any], env: dict[str, Any]) -> None:
    specs = program.graph_signature.output_specs
    user = [out for out, spec in zip(outputs, specs) if spec.kind.name == "USER_OUTPUT"]
    graph = ctx.graph
    names = ["output"] if len(user) == 1 else [f"output_{i}" for i in range(len(user))]
    for name in names:  # free the output names
        clash = next((v for v in graph.values() if v.name == name), None)
        if clash is not None:
            rename_value(graph, clash, graph.unique_name(f"{name}_"))
    ctx.begin(Site("", False), "output")
    seen: set[int] = set()
    for out, name in zip(user, names):
        result = env.get(out.name) if hasattr(out, "name") else out
        if not isinstance(result, Value):
            if result is None or not ctx.is_const(result):
                raise UnsupportedError(f"{ctx.source}: output {name} is a {type(result).__name__}, not a tensor")
            result = ctx.value(result, part=name)
        if result.producer() is None or id(result) in seen:
            result = graph.add_node("Identity", [result], name=unique_name(name, ctx.taken)).outputs[0]
        seen.add(id(result))
        rename_value(graph, result, name)
        graph.outputs.append(result)
