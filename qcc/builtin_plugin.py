"""qcc's own passes, frontends and backends, registered exactly like a plugin's."""

from __future__ import annotations

from qcc.plugins import API_VERSION, Plugin

BUILTINS = Plugin(
    api_version=API_VERSION,
    passes={
        "dce": "qcc.passes.cleanup:DeadCodeElimination",
        "fold-constants": "qcc.passes.cleanup:FoldConstants",
    },
    frontends={
        "onnx": "qcc.frontends.onnx:FRONTEND",
        "nnp": "qcc.frontends.nnp:FRONTEND",
    },
    backends={
        "onnx": "qcc.backends.onnx_float:BACKEND",
        "nnp": "qcc.backends.nnp:BACKEND",
    },
)
