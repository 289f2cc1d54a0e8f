"""What qcc checks in a .pt2 before torch.export.load reads it, and how it lets torch read it.

`torch.export.load` is not meant for untrusted files: it unpickles with `weights_only=False`
(pickled weights and constants, opaque objects, and as a fallback for the example inputs), loads
TorchBind objects, dlopens AOTInductor libraries packed in the archive, evaluates every symbolic
shape expression with `sympy.sympify` (an `eval`) and keeps the file's guard code, which
`ExportedProgram.module()` (called by `run_decompositions`) `exec`s. So before torch sees the file:

- the zip is checked like every archive (`qcc.archive`: paths, member count, sizes, bomb ratio);
- archives with AOTInductor or other native payloads are refused;
- payload configs may not ask for pickled weights/constants or custom/opaque objects;
- every symbolic expression may hold only numbers, operators, shape symbols (`s0`, `u3`) and an
  allowlist of sympy/torch function names; node targets must be `torch.ops.*`, `_operator.*` or
  `math.*`;

and while torch reads it, `torch.load` is forced to `weights_only=True` (its restricted unpickler:
tensors and plain containers only) and the raw unpicklers refuse. The loaded program's guard code
is dropped: qcc never runs the program's guards.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from qcc import archive
from qcc.errors import InvalidInputError, UnsupportedError

NATIVE_DIRS = ("data/aotinductor/", "data/executorch/", "data/mtia")
OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")
TARGET_PREFIXES = ("torch.ops.", "_operator.", "math.")
MAX_JSON_BYTES = 512 * 1024 * 1024

# srepr-style text as torch writes it: Add(FloorDiv(Symbol('s77', positive=True, integer=True), Integer(2)), ...)
_TOKEN = re.compile(r"\s+|\d+\.\d*(?:[eE][-+]?\d+)?|\d+|[A-Za-z_][A-Za-z0-9_]*|'[A-Za-z0-9_.+-]*'|\"[A-Za-z0-9_.+-]*\""
                    r"|\*\*|//|<=|>=|==|!=|[-+*/%(),<>&|~^=]")
_SYMBOL = re.compile(r"^[a-z]{1,4}\d{1,9}$")
_FUNCTIONS = frozenset((
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "Eq", "Ne",
    "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Abs", "floor", "ceiling", "sqrt", "oo", "zoo", "nan", "true",
    "false", "True", "False", "Integer", "Rational", "Float", "Piecewise", "ITE",
    # sympy's srepr classes and the assumption keywords of Symbol(...)
    "Add", "Mul", "Pow", "Symbol", "Dummy", "Tuple", "StrictGreaterThan", "StrictLessThan", "GreaterThan",
    "LessThan", "Equality", "Unequality", "BooleanTrue", "BooleanFalse", "Half", "One", "Zero", "NegativeOne",
    "Infinity", "NegativeInfinity", "ComplexInfinity", "NaN", "int_oo", "IntInfinity", "NegativeIntInfinity",
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "zero", "nonzero", "finite",
    "precision", "evaluate",
))
_FUNCTION_FAMILIES = re.compile(r"^(OpaqueUnaryFn_[a-z0-9]+|BitwiseFn_bitwise_[a-z]+)$")


def _refuse(source: str, what: str) -> NoReturn:
    raise InvalidInputError(f"{source}: {what}; qcc loads torch.export programs with weights only and "
                            "runs no code from the file")


def check_expression(text: str, source: str) -> None:
    """A symbolic shape expression sympy may parse: numbers, operators, symbols, allowed functions."""
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            _refuse(source, f"symbolic expression {text[:80]!r} has character {text[position]!r}")
        token = match.group()
        if (token[0].isalpha() or token[0] == "_") and not (
                _SYMBOL.match(token) or token in _FUNCTIONS or _FUNCTION_FAMILIES.match(token)):
            _refuse(source, f"symbolic expression {text[:80]!r} names {token!r}")
        position = match.end()


def _walk(node: Any, source: str, member: str) -> None:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("use_pickle") is True:
                _refuse(source, f"{member} asks for pickled data")
            path_name = item.get("path_name")
            if isinstance(path_name, str) and path_name.startswith(OBJECT_PREFIXES):
                _refuse(source, f"{member} holds a Python/TorchBind object ({path_name!r})")
            expr = item.get("expr_str")
            if isinstance(expr, str):
                check_expression(expr, source)
            target = item.get("target")
            is_node = "inputs" in item and "outputs" in item
            if is_node and isinstance(target, str) and not target.startswith(TARGET_PREFIXES):
                raise UnsupportedError(f"{source}: node target {target[:80]!r} is not an operator "
                                       f"({', '.join(p + '*' for p in TARGET_PREFIXES)})")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_pt2(path: str | Path) -> None:
    """Refuse a .pt2 whose loading could unpickle objects, run native code or eval expressions."""
    source = str(path)
    if not zipfile.is_zipfile(source):
        raise InvalidInputError(f"{source}: not a .pt2 file (not a zip archive)")
    with archive.reading(source, ".pt2"), zipfile.ZipFile(source) as zf:
        for info in archive.checked_members(zf, source):
            inner = info.filename.split("/", 1)[-1]  # members live under the archive's root folder
            if inner.startswith(NATIVE_DIRS):
                raise UnsupportedError(f"{source}: member {info.filename!r} is a compiled (AOTInductor/ExecuTorch) "
                                       "payload; qcc imports only the exported program")
            if not inner.endswith(".json"):
                continue
            if info.file_size > MAX_JSON_BYTES:
                raise InvalidInputError(f"{source}: member {info.filename!r} ({info.file_size} bytes) is too large "
                                        "to check")
            try:
                document = json.loads(archive.read_member(zf, info, source))
            except (ValueError, RecursionError) as exc:
                raise InvalidInputError(f"{source}: member {info.filename!r} is not valid JSON: {exc}") from None
            _walk(document, source, info.filename)


def _raise_on_unpickle(*args: Any, **kwargs: Any) -> NoReturn:
    raise InvalidInputError("the .pt2 file asks for an unrestricted unpickle; refused")


@contextlib.contextmanager
def weights_only_loading(torch: Any) -> Iterator[None]:
    """While torch.export.load runs: `torch.load` only with weights_only=True, raw unpicklers refuse."""
    original = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    import pickle

    refusing = types.ModuleType("pickle")
    refusing.dumps = pickle.dumps  # type: ignore[attr-defined]
    refusing.loads = refusing.load = _raise_on_unpickle  # type: ignore[attr-defined]
    patches: list[tuple[Any, str, Any]] = [(torch, "load", load)]
    package = None
    with contextlib.suppress(ImportError):
        package = importlib.import_module("torch.export.pt2_archive._package")
    if package is not None and hasattr(package, "pickle"):
        patches.append((package, "pickle", refusing))
    if hasattr(torch._C, "_pickle_load_obj"):
        patches.append((torch._C, "_pickle_load_obj", _raise_on_unpickle))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def drop_guards(program: Any) -> None:
    """Forget the file's guard code: `module()` would exec it, and qcc never checks guards."""
    if hasattr(program, "_guards_code"):
        program._guards_code = []
