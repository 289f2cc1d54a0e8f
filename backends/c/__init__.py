"""Target `c`: standalone C99 inference code (no heap, no VLA, no recursion, one static arena).

Float models compile to float32 kernels; models whose every activation is FixedPoint compile to
integer kernels bit-identical to `qcc.sim.fixed` (nnabla-c-runtime's arithmetic). See
docs/backends.md, section "c".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qcc.backends.c.emit import Generated, generate

from qcc.io import atomic_directory
from qcc.ir.core import Model

__all__ = ["BACKEND", "CBackend", "Generated", "generate"]


class CBackend:
    name = "c"
    extensions: tuple[str, ...] = ()
    output_is_directory = True
    requires: tuple[str, ...] = ()
    integer_affine = True
    """Affine models run in integer arithmetic (qcc.sim.affine_int): --eval simulates that."""

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix columns of the three numeric modes (backends/c/support.py)."""
        from qcc.backends.c.support import op_support

        return op_support()

    def write(self, model: Model, out: str | os.PathLike[str], **options: Any) -> None:
        """Generate everything first (errors leave no output), then write the directory atomically.

        The file stem is the output directory's name as a C identifier (option `c_name` overrides).
        """
        target = Path(out)
        generated = generate(model, options.get("c_name") or target.name or "model")
        with atomic_directory(target) as tmp:
            for filename, text in generated.files.items():
                (tmp / filename).write_text(text)


BACKEND = CBackend()
