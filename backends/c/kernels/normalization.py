"""Softmax and normalization kernels (BatchNorm, LRN, LayerNorm, GroupNorm/InstanceNorm): float32
one operation per statement, between the mode's getter and setter (the order of qcc.sim.f32 for
the layer and group normalizations)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType, scale_params
from qcc.backends.c.kernels.helpers import KernelSet, signature


def lrn_f32(ks: KernelSet) -> str:
    ks.uses_math = True
    return ks.kernel("qcc_lrn_f32", lambda: """
static void qcc_lrn_f32(const float *x, float *y, int n, int c, long inner, int size, float alpha,
                        float beta, float bias)
{
    const int lo = (size - 1) / 2;
    const int hi = size - 1 - lo;
    int b, ch, cc;
    long i;
    for (b = 0; b < n; ++b) {
        for (ch = 0; ch < c; ++ch) {
            const int c0 = ch - lo < 0 ? 0 : ch - lo;
            const int c1 = ch + hi > c - 1 ? c - 1 : ch + hi;
            for (i = 0; i < inner; ++i) {
                float s = 0.0f;
                float d;
                for (cc = c0; cc <= c1; ++cc) {
                    const float v = x[((long)b * c + cc) * inner + i];
                    const float sq = v * v;
                    s += sq;
                }
                d = alpha / (float)size;
                d = d * s;
                d = bias + d;
                y[((long)b * c + ch) * inner + i] =
                    x[((long)b * c + ch) * inner + i] / (float)pow((double)d, (double)beta);
            }
        }
    }
}
""")


def softmax(ks: KernelSet, x: CType, y: CType) -> str:
    """Peak, then exponentials and their float32 sum in index order, then each divided by the sum.

    Fixed point and float: nnabla-c-runtime's generic Softmax, which stores the exponentials in
    the output and reads them back. Affine (qcc.sim.affine_int): exp(v - peak) is recomputed for
    the division, so only the probabilities are quantized.
    """
    name = f"qcc_softmax_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long axis", "long inner", *scale_params(x, y)]
    xv = x.get("x[base + k * inner]", "xinv")
    if y.affine is not None:
        total = f"total += qcc_expf({xv} - peak);"
        final = f"const float e = qcc_expf({xv} - peak);\n                y[base + k * inner] = {y.set('e / total', '')};"
    else:
        total = (f"const float e = qcc_expf({xv} - peak);\n                y[base + k * inner] = {y.set('e', 'yscale')};"
                 "\n                total = total + e;")
        final = (f"const float v = {y.get('y[base + k * inner]', '(1.0f / yscale)')} / total;"
                 f"\n                y[base + k * inner] = {y.set('v', 'yscale')};")
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, i, k;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            const long base = o * axis * inner + i;
            float peak = {x.get("x[base]", "xinv")};
            float total = 0.0f;
            for (k = 0; k < axis; ++k) {{
                const float v = {xv};
                peak = v > peak ? v : peak;
            }}
            for (k = 0; k < axis; ++k) {{
                {total}
            }}
            for (k = 0; k < axis; ++k) {{
                {final}
            }}
        }}
    }}
}}
""", ("expf", *y.setter))


def batchnorm(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_batchnorm_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "const float *mean", "const float *gamma", "const float *beta",
              "const float *std", "long n", "long c", "long inner", *scale_params(x, y)]
    deps = y.setter
    return ks.kernel(name, lambda: f"""
/* ((x - mean) * gamma) / std + beta, one float32 operation at a time. */
{signature(name, params)}
{{
    long b, ch, i;
    for (b = 0; b < n; ++b) {{
        for (ch = 0; ch < c; ++ch) {{
            const long base = (b * c + ch) * inner;
            for (i = 0; i < inner; ++i) {{
                float t = {x.get("x[base + i]", "xinv")} - mean[ch];
                t = t * gamma[ch];
                t = t / std[ch];
                t = t + beta[ch];
                y[base + i] = {y.set("t", "yscale")};
            }}
        }}
    }}
}}
""", deps)


def _moments(x: CType, row: str, count: str) -> str:
    """mean and std = sqrtf(var + eps) of `count` elements at `row` (sums in index order)."""
    get = x.get(f"{row}[k]", "xinv")
    return f"""float sum = 0.0f;
            float var = 0.0f;
            float mean, std;
            for (k = 0; k < {count}; ++k) {{
                sum = sum + {get};
            }}
            mean = sum / (float){count};
            for (k = 0; k < {count}; ++k) {{
                const float d = {get} - mean;
                const float d2 = d * d;
                var = var + d2;
            }}
            var = var / (float){count};
            std = var + eps;
            std = sqrtf(std);"""


def layernorm(ks: KernelSet, x: CType, y: CType) -> str:
    """Rows of n elements: (v - mean) / std, then * scale[k] and + bias[k] when given."""
    ks.uses_math = True
    name = f"qcc_layernorm_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "const float *scale", "const float *bias", "long rows", "long n",
              "float eps", *scale_params(x, y)]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long r, k;
    for (r = 0; r < rows; ++r) {{
        const {x.name} *xr = x + r * n;
        {y.name} *yr = y + r * n;
        {{
            {_moments(x, "xr", "n")}
            for (k = 0; k < n; ++k) {{
                float d = {x.get("xr[k]", "xinv")} - mean;
                d = d / std;
                if (scale != NULL) {{
                    d = d * scale[k];
                }}
                if (bias != NULL) {{
                    d = d + bias[k];
                }}
                yr[k] = {y.set("d", "yscale")};
            }}
        }}
    }}
}}
""", y.setter)


def groupnorm(ks: KernelSet, x: CType, y: CType) -> str:
    """Per (sample, group) of cg channels x inner elements: (v - mean) / std * scale[c] + bias[c]."""
    ks.uses_math = True
    name = f"qcc_groupnorm_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "const float *scale", "const float *bias", "long n",
              "long groups", "long cg", "long inner", "float eps", *scale_params(x, y)]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    const long m = cg * inner;
    long r, k;
    for (r = 0; r < n * groups; ++r) {{
        const {x.name} *xr = x + r * m;
        {y.name} *yr = y + r * m;
        const long c0 = (r % groups) * cg;
        {{
            {_moments(x, "xr", "m")}
            for (k = 0; k < m; ++k) {{
                float d = {x.get("xr[k]", "xinv")} - mean;
                d = d / std;
                d = d * scale[c0 + k / inner];
                d = d + bias[c0 + k / inner];
                yr[k] = {y.set("d", "yscale")};
            }}
        }}
    }}
}}
""", y.setter)
