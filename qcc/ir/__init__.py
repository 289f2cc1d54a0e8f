"""The framework-neutral IR: values, nodes, graphs, op schemas, types, verifier, text form."""

from qcc.ir import ops as _builtin_ops  # noqa: F401  (importing qcc.ir registers the built-in op schemas)
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import AttrSpec, OpDef, OpSchema, all_ops, get_schema, has_op, register
from qcc.ir.surgery import insert_after, match_chains, remove_node, replace_node, topological_sort
from qcc.ir.text import parse_model, print_model
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign, TensorType, storage_bytes
from qcc.ir.verify import check_model, register_model_check, verify_model

__all__ = [
    "Affine", "AttrSpec", "FixedPoint", "Float32", "Graph", "Model", "Node", "OpDef", "OpSchema",
    "QuantType", "Sign", "TensorType", "Value", "all_ops", "check_model", "get_schema", "has_op",
    "insert_after", "match_chains", "parse_model", "print_model", "register", "register_model_check",
    "remove_node", "replace_node", "storage_bytes", "topological_sort", "verify_model",
]
