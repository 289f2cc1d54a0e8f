"""Target `onnx`: the IR as a float ONNX model (opset 13), written atomically."""

from __future__ import annotations

import os

from qcc.io import atomic_write_bytes
from qcc.ir.core import Model
from qcc.runtimes.base import Runtime
from qcc.target import Backend, Constraints, NoOptions, WriteResult


class OnnxBackend(Backend):
    """A float ONNX model (a quantizing scheme writes onnx-qdq instead)."""

    name = "onnx"
    extensions = (".onnx",)

    def constraints(self, options: NoOptions) -> Constraints:
        return Constraints(self.name, schemes=frozenset({"none"}))

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: the IR ops `onnx_export.EXPORTERS` writes."""
        from qcc.formats.onnx_export import EXPORTERS

        return {"onnx": dict.fromkeys(EXPORTERS, "yes")}

    def runtime(self, out: str | os.PathLike[str], options: NoOptions, model: Model | None = None) -> Runtime:
        from qcc.runtimes.onnxruntime import OrtRuntime

        return OrtRuntime(out)

    def to_bytes(self, model: Model) -> bytes:
        from qcc.formats.onnx_export import to_onnx

        return bytes(to_onnx(model).SerializeToString())

    def serialize(self, model: Model, out: str | os.PathLike[str], options: NoOptions) -> WriteResult:
        atomic_write_bytes(out, self.to_bytes(model))
        return WriteResult()


BACKEND = OnnxBackend()
