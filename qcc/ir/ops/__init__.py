"""Built-in op schemas; importing this package registers them."""

from qcc.ir.ops import elementwise, nn, quant, sumpool, tensor

__all__ = ["elementwise", "nn", "quant", "sumpool", "tensor"]
