"""qcc: a quantization compiler for neural networks.

The public API is re-exported here lazily (PEP 562 `__getattr__`): `import qcc` imports nothing
but this file, and each name imports its module on first use, so `qcc --help`, plugin listing
and pass authors never load onnx, onnxruntime, nnabla or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # driving the compiler
    "load": "qcc.driver",
    "compile": "qcc.driver",
    "write": "qcc.api",
    "run": "qcc.api",
    # passes and the pass manager
    "Pass": "qcc.pm.base",
    "PassResult": "qcc.pm.base",
    "PassContext": "qcc.pm.base",
    "Analysis": "qcc.pm.base",
    "AnalysisManager": "qcc.pm.base",
    "PassManager": "qcc.pm.manager",
    "parse_spec": "qcc.pm.spec",
    # plugins
    "Plugin": "qcc.plugins",
    "register_pass": "qcc.plugins",
    "PLUGIN_API_VERSION": "qcc.plugins:API_VERSION",
    # the IR and graph surgery (also under qcc.ir)
    "Graph": "qcc.ir",
    "Model": "qcc.ir",
    "Node": "qcc.ir",
    "Value": "qcc.ir",
    "TensorType": "qcc.ir",
    "insert_after": "qcc.ir",
    "replace_node": "qcc.ir",
    "remove_node": "qcc.ir",
    "match_chains": "qcc.ir",
    "print_model": "qcc.ir",
    "parse_model": "qcc.ir",
    "verify_model": "qcc.ir",
    # errors
    "QccError": "qcc.errors",
    "UsageError": "qcc.errors",
    "InvalidInputError": "qcc.errors",
    "UnsupportedError": "qcc.errors",
    "InternalError": "qcc.errors",
}
_SUBMODULES = frozenset({"api", "driver", "errors", "ir", "pm", "plugins", "sim", "testing"})

__all__ = [
    "Analysis", "AnalysisManager", "Graph", "InternalError", "InvalidInputError", "Model", "Node",
    "PLUGIN_API_VERSION", "Pass", "PassContext", "PassManager", "PassResult", "Plugin", "QccError",
    "TensorType", "UnsupportedError", "UsageError", "Value", "compile", "insert_after", "load",
    "match_chains", "parse_model", "parse_spec", "print_model", "register_pass", "remove_node",
    "replace_node", "run", "verify_model", "write",
]


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is not None:
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"qcc.{name}")
    else:
        raise AttributeError(f"module 'qcc' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


if TYPE_CHECKING:  # real imports for type checkers and IDEs; never executed
    from qcc.api import run, write
    from qcc.driver import compile, load
    from qcc.errors import InternalError, InvalidInputError, QccError, UnsupportedError, UsageError
    from qcc.ir import (
        Graph,
        Model,
        Node,
        TensorType,
        Value,
        insert_after,
        match_chains,
        parse_model,
        print_model,
        remove_node,
        replace_node,
        verify_model,
    )
    from qcc.plugins import API_VERSION as PLUGIN_API_VERSION
    from qcc.plugins import Plugin, register_pass
    from qcc.pm.base import Analysis, AnalysisManager, Pass, PassContext, PassResult
    from qcc.pm.manager import PassManager
    from qcc.pm.spec import parse_spec
