"""Target `c`: standalone C99 inference code (no heap, no VLA, no recursion, one static arena).

Float models compile to float32 kernels; models whose every activation is FixedPoint compile to
integer kernels bit-identical to `qcc.sim.fixed` (nnabla-c-runtime's arithmetic). See
docs/backends.md, section "c".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import attrs
from qcc.backends.c.emit import Generated, file_names, generate

from qcc.io import atomic_directory
from qcc.ir.core import Model
from qcc.outputs import check_generated_names
from qcc.pm.base import Pass
from qcc.runtimes.base import Runtime
from qcc.target import NNABLA_C_RUNTIME, Backend, Constraints, WriteResult, is_quantized

__all__ = ["BACKEND", "CBackend", "Generated", "file_names", "generate"]


@attrs.frozen
class COptions:
    name: str | None = attrs.field(
        default=None, metadata={"help": "file stem and symbol prefix (default: the output directory's name)"})
    isa: Literal["portable", "dot8"] = attrs.field(
        default="portable", metadata={"help": "affine int8 dot products: portable (int16 products, pmaddwd/SMLAD) "
                                      "or dot8 (uint8 x int8, for CPUs with VNNI / Arm DOTPROD)"})
    weights4: Literal["packed", "int8"] = attrs.field(
        default="packed", metadata={"help": "fixed4's 4-bit weights: two a byte (half the flash, unpacked into the "
                                    "arena's end before use) or int8"})
    unpack_bytes: int = attrs.field(
        default=2048, validator=attrs.validators.ge(1),
        metadata={"help": "weights4=packed: most weights unpacked at once (a layer runs in slices of output "
                  "channels; at least one channel or group)"})


class CBackend(Backend):
    """Standalone C99 source: float, fixed point (nnabla-c-runtime's arithmetic) or affine int8."""

    name = "c"
    writes_directory = True
    Options = COptions

    def constraints(self, options: COptions) -> Constraints:
        # fixed point computes exactly what nnabla-c-runtime computes; affine models run on
        # integer kernels (qcc.sim.affine_int), which --eval simulates
        return Constraints(self.name, fixed_point=NNABLA_C_RUNTIME, integer_affine=True)

    def legalization(self, options: COptions) -> list[Pass]:
        """LayerNorm spelled out in elementwise ops (paddle2onnx, torch.onnx below opset 17) has a
        Div by a tensor, which affine mode cannot run: fused, it is one float island."""
        from qcc.passes.fuse_layernorm import FuseLayerNorm

        return [FuseLayerNorm()]

    def memory_plan(self, options: COptions) -> str | None:
        return "plan-memory{kind=arena,aliases=true,inplace=true}"

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix columns of the three numeric modes (backends/c/support.py)."""
        from qcc.backends.c.support import op_support

        return op_support()

    def runtime(self, out: str | os.PathLike[str], options: COptions, model: Model | None = None) -> Runtime | None:
        """The directory built with its Makefile and run (None without a C compiler and make)."""
        from qcc.runtimes import gcc
        from qcc.runtimes.base import EXACT, FLOAT

        if not gcc.available():
            return None
        # integer modes compute exactly what qcc.sim.fixed / qcc.sim.affine_int compute
        return gcc.CBinary(out, EXACT if is_quantized(model) else FLOAT)

    def serialize(self, model: Model, out: str | os.PathLike[str], options: COptions) -> WriteResult:
        """Generate everything first (errors leave no output), then write the directory atomically.

        The file stem is the output directory's name as a C identifier (option `name` overrides).
        """
        target = Path(out)
        check_generated_names(str(target), self.file_names(target, options))
        generated = generate(model, options.name or target.name or "model", isa=options.isa,
                             weights4=options.weights4, unpack_bytes=options.unpack_bytes)
        with atomic_directory(target) as tmp:
            for filename, text in generated.files.items():
                (tmp / filename).write_text(text)
        summary: dict[str, list[Any]] = {"float_islands": list(generated.float_islands)} if generated.float_islands else {}
        if generated.notes:
            summary["notes"] = list(generated.notes)
        return WriteResult(summary=summary)

    def file_names(self, out: str | os.PathLike[str], options: COptions | None = None) -> list[str]:
        """What the output directory will hold: the sources and what its Makefile builds there."""
        return file_names(getattr(options, "name", None) or Path(out).name or "model")


BACKEND = CBackend()
