"""C source of the affine int8/uint8 kernels: exactly the arithmetic of `qcc.sim.affine_int`.

Accumulators are int32 (the lowering proves no sum overflows), requantization is one int64
multiply and a rounding shift (`qcc_requant`); the few float kernels (Softmax, BatchNorm and the
quantization of inputs) write one float32 operation per statement, as the fixed-point ones do.
"""

from __future__ import annotations

from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels import KernelSet, _conv_source, _pool_loops, _sig


def quantize_input(ks: KernelSet, y: CType) -> str:
    name = f"qcc_quantize_{y.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const float *x, {y.name} *q, long n, float scale, int32_t zp)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        q[i] = ({y.name})qcc_quantize(x[i], scale, zp, {y.lo}, {y.hi});
    }}
}}
""", ("quantize",))


def dequantize(ks: KernelSet, x: CType) -> str:
    name = f"qcc_dequantize_{x.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *q, float *y, long n, float scale, int32_t zp)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = (float)((int32_t)q[i] - zp) * scale;
    }}
}}
""")


def conv(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    """The float/fixed kernel's loops (row chunks, 4 output channels at once) on (x - zx) * w with
    int32 sums; padding reads as zx (the real zero); the bias starts the sum; requant per channel."""
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: _conv_source(name, x, w, y), ("conv_t", "requant"))


def dense(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    name = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"const {w.name} *w", "const int32_t *bias", f"{y.name} *y", "long n", "long k",
              "long m", "int32_t zx", "const int32_t *mult", "const int32_t *shift", "int32_t zy"]
    return ks.kernel(name, lambda: f"""
/* y = requant(bias + (x - zx) (n, k) @ w^T, w (m, k) centered), per output column. */
{_sig(name, params)}
{{
    long i, j, t;
    for (i = 0; i < n; ++i) {{
        const {x.name} *xi = x + i * k;
        for (j = 0; j < m; ++j) {{
            const {w.name} *wj = w + j * k;
            int32_t acc = bias[j];
            for (t = 0; t < k; ++t) {{
                acc += ((int32_t)xi[t] - zx) * (int32_t)wj[t];
            }}
            y[i * m + j] = ({y.name})qcc_requant(acc, mult[j], shift[j], zy, {y.lo}, {y.hi});
        }}
    }}
}}
""", ("requant",))


def avgpool(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_avgpool_{x.suffix}_{y.suffix}"
    body = f"""
                    for (iy = hs; iy < he; ++iy) {{
                        for (ix = ws; ix < we; ++ix) {{
                            s += (int32_t)x[plane * p->h * p->w + (long)iy * p->w + ix] - zx;
                        }}
                    }}
                    y[plane * p->oh * p->ow + (long)oy * p->ow + ox] =
                        ({y.name})qcc_requant(s, mult[count], shift[count], zy, {y.lo}, {y.hi});"""
    params = (f"const {x.name} *x, {y.name} *y, const qcc_pool_t *p, int32_t zx, const int32_t *mult, "
              "const int32_t *shift, int32_t zy")
    decls = "\n                    int32_t s = 0;\n                    long count;"
    return ks.kernel(name, lambda: f"""
/* The sum of (x - zx) over the window, requantized by the multiplier of its element count. */
static void {name}({params})""" + _pool_loops(body, decls, "avg"), ("pool_t", "requant"))


def table(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_table_{x.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: f"""
/* One-input elementwise op as a lookup: t[x - lo] (the table is computed by qcc). */
static void {name}(const {x.name} *x, {y.name} *y, long n, const {y.name} *t)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = t[(int32_t)x[i] - ({x.lo})];
    }}
}}
""")


BINARY = {
    # op: (extra parameters, element expression from av, bv)
    "Add": ("int32_t za, int32_t zb, int64_t ma, int64_t mb, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ma + ((int64_t)bv - zb) * mb, 1, shift, zy, LO, HI)"),
    "Sub": ("int32_t za, int32_t zb, int64_t ma, int64_t mb, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ma - ((int64_t)bv - zb) * mb, 1, shift, zy, LO, HI)"),
    "Mul": ("int32_t za, int32_t zb, int64_t mult, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ((int64_t)bv - zb), mult, shift, zy, LO, HI)"),
    "Max": ("int32_t za, int64_t ma, int sa, int32_t zb, int64_t mb, int sb, int32_t zy",
            "qcc_max(qcc_requant((int64_t)av - za, ma, sa, zy, LO, HI), qcc_requant((int64_t)bv - zb, mb, sb, zy, LO, HI))"),
    "Min": ("int32_t za, int64_t ma, int sa, int32_t zb, int64_t mb, int sb, int32_t zy",
            "qcc_min(qcc_requant((int64_t)av - za, ma, sa, zy, LO, HI), qcc_requant((int64_t)bv - zb, mb, sb, zy, LO, HI))"),
}

def binary(ks: KernelSet, op: str, a: CType, b: CType, y: CType) -> str:
    """Elementwise with broadcasting (p == NULL: same shapes); see BINARY for the arithmetic."""
    name = f"qcc_{op.lower()}_{a.suffix}_{b.suffix}_{y.suffix}"
    extra, expr = BINARY[op]
    expr = f"({y.name}){expr.replace('LO', str(y.lo)).replace('HI', str(y.hi))}"
    helpers = ("bcast", "requant") + (("minmax",) if op in ("Max", "Min") else ())
    return ks.kernel(name, lambda: f"""
static void {name}(const {a.name} *a, const {b.name} *b, {y.name} *y, long n, const qcc_bcast_t *p, {extra})
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long i, ia = 0, ib = 0;
    if (p == NULL) {{
        for (i = 0; i < n; ++i) {{
            const int32_t av = a[i];
            const int32_t bv = b[i];
            y[i] = {expr};
        }}
        return;
    }}
    for (i = 0; i < n; ++i) {{
        const int32_t av = a[ia];
        const int32_t bv = b[ib];
        y[i] = {expr};
        qcc_bcast_next(p, idx, &ia, &ib);
    }}
}}
""", helpers)
