"""Resize kernels over the last two axes: nearest (a move of stored elements, requantized like
any copy) and linear (float32 between the mode's getter and setter, qcc.sim.f32.resize_linear's
operation order). The source rows/columns and weights are arrays qcc computes once
(`qcc.ir.ops.resize.axis_plan`)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType, scale_params
from qcc.backends.c.kernels.helpers import KernelSet, signature
from qcc.backends.c.kernels.movement import convert

_GEOMETRY = ["long outer", "long ih", "long iw", "long oh", "long ow"]


def nearest(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_resize_nearest_{x.suffix}_{y.suffix}"
    value, helpers, extra = convert(x, y, "row[rx[j]]")
    params = [f"const {x.name} *x", f"{y.name} *y", *_GEOMETRY, "const int32_t *ry", "const int32_t *rx", *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, i, j;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < oh; ++i) {{
            const {x.name} *row = x + (o * ih + ry[i]) * iw;
            {y.name} *out = y + (o * oh + i) * ow;
            for (j = 0; j < ow; ++j) {{
                out[j] = {value};
            }}
        }}
    }}
}}
""", helpers)


def linear(ks: KernelSet, x: CType, y: CType) -> str:
    """top = r0[x0] * wx0 + r0[x1] * wx1, bottom likewise on r1, then top * wy0 + bottom * wy1."""
    name = f"qcc_resize_linear_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", *_GEOMETRY, "const int32_t *y0", "const int32_t *y1",
              "const float *wy0", "const float *wy1", "const int32_t *x0", "const int32_t *x1", "const float *wx0",
              "const float *wx1", *scale_params(x, y)]

    def get(expr: str) -> str:
        return x.get(expr, "xinv")

    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, i, j;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < oh; ++i) {{
            const {x.name} *r0 = x + (o * ih + y0[i]) * iw;
            const {x.name} *r1 = x + (o * ih + y1[i]) * iw;
            {y.name} *out = y + (o * oh + i) * ow;
            for (j = 0; j < ow; ++j) {{
                float top = {get("r0[x0[j]]")} * wx0[j];
                float bottom = {get("r1[x0[j]]")} * wx0[j];
                float t = {get("r0[x1[j]]")} * wx1[j];
                float v;
                top = top + t;
                t = {get("r1[x1[j]]")} * wx1[j];
                bottom = bottom + t;
                v = top * wy0[i];
                t = bottom * wy1[i];
                v = v + t;
                out[j] = {y.set("v", "yscale")};
            }}
        }}
    }}
}}
""", y.setter)
