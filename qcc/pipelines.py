"""Default pipelines per quantization scheme and target."""

from __future__ import annotations

from typing import Any

from qcc.errors import UnsupportedError


def default_pipeline(scheme: str, target: str, opts: Any) -> str:
    if scheme == "none":
        return ""
    raise UnsupportedError(f"--quantize {scheme}: this qcc has no pipeline for it yet (target {target!r})")
