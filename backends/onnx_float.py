"""Target `onnx`: the IR as a float ONNX model (opset 13), written atomically."""

from __future__ import annotations

import os
from typing import Any

from qcc.io import atomic_write_bytes
from qcc.ir.core import Model


class OnnxBackend:
    name = "onnx"
    extensions = (".onnx",)
    output_is_directory = False
    requires: tuple[str, ...] = ()

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: the IR ops `onnx_export.EXPORTERS` writes."""
        from qcc.backends.onnx_export import EXPORTERS

        return {"onnx": dict.fromkeys(EXPORTERS, "yes")}

    def to_bytes(self, model: Model) -> bytes:
        from qcc.backends.onnx_export import to_onnx

        return bytes(to_onnx(model).SerializeToString())

    def write(self, model: Model, out: str | os.PathLike[str], **options: Any) -> None:
        atomic_write_bytes(out, self.to_bytes(model))


BACKEND = OnnxBackend()
