"""Built-in op schemas; importing this package registers them."""

from qcc.ir.ops import elementwise, indexing, nn, normalization, quant, resize, sumpool, tensor

__all__ = ["elementwise", "indexing", "nn", "normalization", "quant", "resize", "sumpool", "tensor"]
