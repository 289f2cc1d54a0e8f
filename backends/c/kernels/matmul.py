"""Batched matrix products (MatMul): float32, and affine int8/uint8 with int32 sums of
(a - za) * (b - zb) requantized once (qcc.sim.affine_int.matmul_kernel). The batch's element
offsets into a and b are arrays qcc computes (broadcast batch axes repeat an offset)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.helpers import KernelSet, signature

_SHAPE = ["long batch", "const int32_t *ao", "const int32_t *bo", "long m", "long k", "long n"]


def matmul_f32(ks: KernelSet) -> str:
    """Each output row starts at zero and adds a[i][p] * b[p][:] for p in order (like Dense)."""
    params = ["const float *a", "const float *b", "float *y", *_SHAPE]
    return ks.kernel("qcc_matmul_f32", lambda: f"""
{signature("qcc_matmul_f32", params)}
{{
    long t, i, j, p;
    for (t = 0; t < batch; ++t) {{
        const float *at = a + ao[t];
        const float *bt = b + bo[t];
        float *yt = y + t * m * n;
        for (i = 0; i < m; ++i) {{
            float *yi = yt + i * n;
            for (j = 0; j < n; ++j) {{
                yi[j] = 0.0f;
            }}
            for (p = 0; p < k; ++p) {{
                const float av = at[i * k + p];
                const float *br = bt + p * n;
                for (j = 0; j < n; ++j) {{
                    const float prod = av * br[j];
                    yi[j] += prod;
                }}
            }}
        }}
    }}
}}
""")


def matmul_affine(ks: KernelSet, a: CType, b: CType, y: CType) -> str:
    name = f"qcc_matmul_{a.suffix}_{b.suffix}_{y.suffix}"
    params = [f"const {a.name} *a", f"const {b.name} *b", f"{y.name} *y", *_SHAPE, "int32_t za", "int32_t zb",
              "int32_t mult", "int shift", "int32_t zy"]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long t, i, j, p;
    for (t = 0; t < batch; ++t) {{
        const {a.name} *at = a + ao[t];
        const {b.name} *bt = b + bo[t];
        {y.name} *yt = y + t * m * n;
        for (i = 0; i < m; ++i) {{
            for (j = 0; j < n; ++j) {{
                int32_t acc = 0;
                for (p = 0; p < k; ++p) {{
                    acc += ((int32_t)at[i * k + p] - za) * ((int32_t)bt[p * n + j] - zb);
                }}
                yt[i * n + j] = ({y.name})qcc_requant(acc, mult, shift, zy, {y.lo}, {y.hi});
            }}
        }}
    }}
}}
""", ("requant",))
