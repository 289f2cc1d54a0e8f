"""C source of target c's kernels, one module per op family, generated per element-type combination.

`helpers` (the integer helpers, parameter structs and the `KernelSet` a model emits), `conv`
(Conv, Dense), `pool`, `elementwise` (activations, binary ops, affine tables), `normalization`
(Softmax, BatchNorm, LRN) and `movement` (requantizing copies, Concat, Transpose, input/output
transfers). Integer kernels reproduce `qcc.sim.fixed` / `qcc.sim.affine_int` exactly; float code
writes one operation per statement where a multiply meets an add, so no compiler contracts it into
an FMA under the default C99 rules, and the float-in-between kernels of the integer modes depend
on that and on FLT_EVAL_METHOD == 0 (checked at compile time).
"""
